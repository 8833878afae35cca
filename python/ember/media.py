"""Images in prompts: the contract between the doors that take them (the server's image_url,
Anthropic image blocks and Responses input_image parts, `ember run --image`, `LLM.chat(...,
images=...)`) and the engine that encodes them.

A door decodes each image to RGB pixels (a numpy uint8 array of shape (height, width, 3)) and
writes MEDIA_MARKER into the prompt text where the image stands (as llama-server's mtmd does);
Engine.tokenize_images expands each marker into the model's run of image tokens, and
Engine.submit(..., images=...) takes the pixels in the markers' order."""

from __future__ import annotations

MEDIA_MARKER = "<__media__>"
