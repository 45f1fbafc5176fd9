"""Data readers and the corpus builder; every file is read from the data root (`workbench.paths`).

- `conllu`: UD treebanks (`load_treebank`, `read_conllu`) and GUM coreference (`read_gum_coref`).
- `gap`: GAP pronoun coreference with offsets mapped to word spans (`read_gap`).
- `raw`: raw corpora as documents (`load_documents`, `RAW_CORPORA`, `load_labelled`).
- `wordnet`: WordNet 3.0 synonyms / antonyms / hypernyms.
- `swadesh`: Swadesh lists and bilingual dictionaries.
- `corpus`: seeded document-level train/held-out corpora with a membership manifest (`build_corpus`).

Modules are imported one by one (no re-exports here) so that reading a treebank does not pull
in pandas or numpy.
"""
