__version__ = "0.1.0"

# tqdm.auto chooses widget progress bars in a Jupyter kernel and, without ipywidgets, warns once, at its import, with
# the environment's path (the docs site's front page and stage pages showed the warning). Text bars need no warning:
# tqdm.auto is imported here, which every `import triage_cf...` passes first, with that one message filtered.
import warnings as _warnings

with _warnings.catch_warnings():
    _warnings.filterwarnings("ignore", message="IProgress not found")
    import tqdm.auto  # noqa: E402,F401
