"""What leaves a run: peft/MLX export, the Hugging Face Hub, and model checks."""
