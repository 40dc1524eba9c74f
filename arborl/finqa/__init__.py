"""A FinQA-style recipe: generated financial statements, arithmetic questions, a calculator and a sandboxed python tool.

See ``docs/finqa.md``: :mod:`arborl.finqa.data` (generator and JSONL format),
:mod:`arborl.finqa.reward` (execution accuracy), :mod:`arborl.finqa.env` (the tool env and its oracle).
"""
