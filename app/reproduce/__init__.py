"""`bertology reproduce`: the literature's headline findings beside ours, in one table and one figure.

`spec` says what a row is (a cited paper number, our measurement, a stated test that computes the
verdict); `rows` holds the rows and the findings not comparable here, with their sources quoted in
`citations.yaml`; `report` runs them and writes the table (Markdown, CSV), the figure and a manifest.
"""
