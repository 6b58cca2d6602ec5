"""The reports: the generated tables and figures of the docs, from the committed summaries alone.

`python -m bench report` runs `report` (each scenario's tables between marker comments, plus the
raw per-request results' save/load and plots) and `pages` (which page under docs/ holds which
section), with the results-page sections built here: the glance table and figure (`headline`),
the targets hit or missed (`scorecard`), AWS's published rows beside ours (`published`) and the
A10G sensitivity table (`sensitivity`). `herding` and `stickiness` read raw run results
(git-ignored bench/results/) for what the summaries do not record. Nothing here starts a
process or opens a connection: rerunning a report on the same summaries rewrites the same text.
"""
