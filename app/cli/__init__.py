"""The workbench's commands (`python -m app <command>`), one module each: parse the arguments, call
app/service, print. app/__main__.py assembles them; `python -m app deploy` is deploy's own CLI with the
workbench store as its ledger (deploy.py, with app/core/deploy_records.py)."""
