"""The model side of the EngineCore: weights loading, the model runner and the sampler."""
