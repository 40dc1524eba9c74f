"""The code-agent recipe: generated programming and bug-fixing problems, a sandboxed ``python`` tool, a hidden-test judge."""
