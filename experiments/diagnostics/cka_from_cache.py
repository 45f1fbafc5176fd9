"""Linear CKA of SmolLM2 against the reference encoder, MiniLM and MPNet from the model-pair run's cached
activations (same 2,000 PUD tokens: the run's pair_index, seed 0; docs/evidence/real-models.md). The cache folder
names are those of /tmp/runs-real3 on 2026-11-26."""
import numpy as np
from pathlib import Path
from workbench.activations import Activations
from workbench.geometry import cka_matrix
root = Path("/tmp/runs-real3/cache/activations")
names = {"smollm2": "decoder-float32-b86b95bf7cbdb5c02ac4", "minilm": "encoder-float32-10ce6423f54536919f1e",
         "ref": "encoder-float32-b3a99915e6e837feada0", "mpnet": "encoder-float32-e54a2fb6bfc3c6cd6407"}
idx = np.sort(np.random.default_rng(0).choice(21180, 2000, replace=False))
V = {k: [np.asarray(l[idx], dtype=np.float32) for l in Activations.load(root / f"align_model-pair-first-{v}").layers] for k, v in names.items()}
check = cka_matrix(V["minilm"], V["mpnet"])
print("check minilm x mpnet [0,0], [2,2], [6,11]:", check[0, 0].round(3), check[2, 2].round(3), check[6, 11].round(3))
np.set_printoptions(linewidth=250)
for other in ("ref", "minilm", "mpnet"):
    M = cka_matrix(V[other], V["smollm2"])  # rows: the shallower model, columns: SmolLM2 layers 0-30
    print(f"== {other} (rows) x smollm2 (cols 0..30)")
    for i, row in enumerate(M):
        print(i, " ".join(f"{x:.2f}" for x in row), "| best", int(row.argmax()), f"{row.max():.2f}")
    print("smollm2 layer -> best", other, "layer:", M.argmax(0).tolist())
