"""Put first on PYTHONPATH by the book's launcher when PPBOOK_NCCL_RULES=1 (ppbook.nccl_rules):
every Python process then starts with NCCL's rules in place, a script that imports nothing from
the book included. Python imports this module by itself at start-up."""

import os

if os.environ.get("PPBOOK_NCCL_RULES", "").strip().lower() in ("1", "true", "yes", "on"):
    from ppbook import nccl_rules

    nccl_rules.install()
