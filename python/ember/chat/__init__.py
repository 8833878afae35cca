"""Chat templates: rendering a conversation into a prompt (template), the bounds a rendering
stays within (limits), and the built-in templates (builtin)."""
