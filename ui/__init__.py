"""The mlx-spec Gradio app: watch speculative decoding happen.

``python -m ui.app`` starts it on http://127.0.0.1:7860 with the embedded
default model pair. ``render`` turns tokens and statistics into HTML,
``session`` runs the models on one MLX thread, ``app`` wires up the page.
"""
