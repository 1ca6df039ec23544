"""The frontend: prompts to token ids (input_processor), token ids to RequestOutputs (output_processor)."""
