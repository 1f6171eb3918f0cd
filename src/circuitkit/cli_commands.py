"""Sub-commands of the `circuitkit` command; each registers itself in circuitkit.cli.COMMANDS."""
