"""Tools: a request's tools checked (request), put into the prompt by the chat template
(prompt), and the calls read back out of the model's output (calls)."""
