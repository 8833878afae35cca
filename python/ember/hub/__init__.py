"""Where models come from: local files and the demo model (models), the Hugging Face Hub
(hf), and the error both raise (errors)."""
