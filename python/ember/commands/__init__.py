"""One module per `ember` subcommand; each exposes register(app)."""
