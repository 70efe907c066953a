"""`specrouter connect AGENT`: an agent's configuration for this gateway, printed or written.

gateway.py  which gateway: URL, CA file, client key, model (flags, SPECROUTER_* variables,
            or the demo's state directory), checked with one GET /models, bounded in time
            and size
agents.py   what each agent reads (Codex, Claude Code, aider, the OpenAI and Anthropic SDKs):
            the files to write and the command that uses them
codex_catalog.py  Codex's catalog entry for the model, from the installed Codex's own
            fallback instructions (no "Model metadata not found" warning)
files.py    writing them: merged into a TOML file the user owns (comments kept), a backup of
            any file that changes, the CA bundle, modes and owners kept, links followed,
            temporary files created exclusively
quoting.py  every value quoted for its format (shell, TOML, JSON, YAML), control characters
            refused
command.py  the command line
"""
