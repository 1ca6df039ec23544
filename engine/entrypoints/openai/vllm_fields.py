"""Every request field of vLLM's OpenAI server and every SamplingParams field, as read from vLLM's
source (github.com/vllm-project/vllm). Each one is implemented (the request struct declares it),
or placed by engine/entrypoints/openai/field_support.py (refused, or a no-op with its reason);
the test suite fails when a name here is neither. To follow a newer vLLM, add its new names
here: the test then names each one still to be placed.
"""

# Where each list was read (file and commit).
VLLM_SOURCES = {
    'ChatCompletionRequest': (
        'vllm/entrypoints/openai/chat_completion/protocol.py at '
        '002032ee2b18e1f7bd924ec47b62504ba3866063'
    ),
    'CompletionRequest': (
        'vllm/entrypoints/openai/completion/protocol.py at 002032ee2b18e1f7bd924ec47b62504ba3866063'
    ),
    'EmbeddingRequest': (
        'EmbeddingCompletionRequest in vllm/frontend/entrypoints/pooling/embed/protocol.py at '
        '055e47c28003156421365af985d676fc921cb075 (PoolingBasicRequestMixin + '
        'CompletionRequestMixin + EmbedRequestMixin of vllm/entrypoints/pooling/base/protocol.py at '
        '020638a6b026e4d96f34e6e7ed12c3390fbf7416)'
    ),
    'ResponsesRequest': (
        'vllm/entrypoints/openai/responses/protocol.py as docs.vllm.ai shows it (lastmod 2026-09-24)'
    ),
    'PoolingRequest': (
        'PoolingCompletionRequest in vllm/entrypoints/pooling/pooling/protocol.py at '
        '01cfbaf63434b3d5ec8a9e492d5111f6efc55e77 (the mixins of vllm/entrypoints/pooling/base/protocol.py at '
        '020638a6b026e4d96f34e6e7ed12c3390fbf7416)'
    ),
    'ClassificationRequest': (
        'ClassificationCompletionRequest in vllm/frontend/entrypoints/pooling/classify/protocol.py '
        '(PoolingBasicRequestMixin + CompletionRequestMixin + ClassifyRequestMixin, as above)'
    ),
    'ScoreRequest': (
        'ScoreRequest (its four forms) in vllm/entrypoints/pooling/scoring/protocol.py at '
        '004706d84ceba73d7efe0458e6f682c8691ff904'
    ),
    'RerankRequest': (
        'RerankRequest in vllm/entrypoints/pooling/scoring/protocol.py at '
        '004706d84ceba73d7efe0458e6f682c8691ff904'
    ),
    'AnthropicMessagesRequest': (
        'vllm/entrypoints/anthropic/protocol.py at 00589e563e771f2de7abeb48bd0814873e891411'
    ),
    'AnthropicCountTokensRequest': (
        'vllm/entrypoints/anthropic/protocol.py at 00589e563e771f2de7abeb48bd0814873e891411'
    ),
    'StreamOptions': (
        'vllm/entrypoints/openai/protocol.py StreamOptions at '
        '0052bed36509c7a5a2d8e48265334e40cf2f5a0e'
    ),
    'SamplingParams': (
        'vllm/sampling_params.py at 00388f6573ccfcffad607b8c9ecdf341a4669ceb (public fields; the '
        "underscore ones are internal), plus truncate_prompt_tokens, which vLLM's SamplingParams "
        'carried before it moved to tokenization_kwargs'
    ),
}

VLLM_FIELDS: dict[str, tuple[str, ...]] = {
    'ChatCompletionRequest': (
        'messages', 'model', 'frequency_penalty', 'logit_bias', 'logprobs', 'top_logprobs',
        'max_tokens', 'max_completion_tokens', 'n', 'presence_penalty', 'response_format', 'seed',
        'stop', 'stream', 'stream_options', 'temperature', 'top_p', 'tools', 'tool_choice',
        'reasoning_effort', 'thinking_token_budget', 'include_reasoning', 'parallel_tool_calls',
        'user', 'use_beam_search', 'top_k', 'min_p', 'repetition_penalty', 'watermarking',
        'length_penalty', 'stop_token_ids', 'include_stop_str_in_output', 'ignore_eos',
        'min_tokens', 'skip_special_tokens', 'spaces_between_special_tokens',
        'truncate_prompt_tokens', 'truncation_side', 'prompt_logprobs', 'logprob_token_ids',
        'allowed_token_ids', 'bad_words', 'echo', 'add_generation_prompt', 'continue_final_message',
        'add_special_tokens', 'documents', 'chat_template', 'chat_template_kwargs',
        'media_io_kwargs', 'mm_processor_kwargs', 'structured_outputs', 'priority', 'request_id',
        'session_id', 'return_tokens_as_token_ids', 'return_token_ids',
        'routed_experts_prompt_start', 'return_token_offsets', 'return_prompt_text',
        'return_mm_kwargs', 'cache_salt', 'kv_transfer_params', 'ec_transfer_params', 'vllm_xargs',
        'repetition_detection', 'stream_interval'
    ),
    'CompletionRequest': (
        'model', 'prompt', 'echo', 'frequency_penalty', 'logit_bias', 'logprobs', 'max_tokens', 'n',
        'presence_penalty', 'seed', 'stop', 'stream', 'stream_options', 'suffix', 'temperature',
        'top_p', 'user', 'use_beam_search', 'top_k', 'min_p', 'repetition_penalty', 'watermarking',
        'length_penalty', 'stop_token_ids', 'include_stop_str_in_output', 'ignore_eos',
        'min_tokens', 'skip_special_tokens', 'spaces_between_special_tokens',
        'truncate_prompt_tokens', 'truncation_side', 'allowed_token_ids', 'prompt_logprobs',
        'logprob_token_ids', 'bad_words', 'prompt_embeds', 'add_special_tokens', 'response_format',
        'structured_outputs', 'priority', 'request_id', 'session_id', 'return_tokens_as_token_ids',
        'return_token_ids', 'routed_experts_prompt_start', 'return_token_offsets',
        'return_mm_kwargs', 'cache_salt', 'kv_transfer_params', 'ec_transfer_params', 'vllm_xargs',
        'repetition_detection', 'thinking_token_budget', 'stream_interval'
    ),
    'EmbeddingRequest': (
        'model', 'user', 'truncate_prompt_tokens', 'padding', 'truncation_side', 'request_id',
        'priority', 'mm_processor_kwargs', 'cache_salt', 'input', 'add_special_tokens',
        'encoding_format', 'embed_dtype', 'endianness', 'dimensions', 'use_activation'
    ),
    'PoolingRequest': (
        'model', 'user', 'truncate_prompt_tokens', 'padding', 'truncation_side', 'request_id',
        'priority', 'mm_processor_kwargs', 'cache_salt', 'input', 'add_special_tokens',
        'encoding_format', 'embed_dtype', 'endianness', 'dimensions', 'use_activation', 'task'
    ),
    'ClassificationRequest': (
        'model', 'user', 'truncate_prompt_tokens', 'padding', 'truncation_side', 'request_id',
        'priority', 'mm_processor_kwargs', 'cache_salt', 'input', 'add_special_tokens',
        'use_activation'
    ),
    'ScoreRequest': (
        'model', 'user', 'truncate_prompt_tokens', 'padding', 'truncation_side', 'request_id',
        'priority', 'mm_processor_kwargs', 'cache_salt', 'use_activation', 'data_1', 'data_2',
        'queries', 'documents', 'items', 'text_1', 'text_2'
    ),
    'RerankRequest': (
        'model', 'user', 'truncate_prompt_tokens', 'padding', 'truncation_side', 'request_id',
        'priority', 'mm_processor_kwargs', 'cache_salt', 'use_activation', 'query', 'documents',
        'top_n'
    ),
    'ResponsesRequest': (
        'background', 'include', 'input', 'instructions', 'max_output_tokens', 'max_tool_calls',
        'metadata', 'model', 'logit_bias', 'parallel_tool_calls', 'previous_response_id', 'prompt',
        'reasoning', 'include_reasoning', 'service_tier', 'store', 'stream', 'temperature', 'text',
        'tool_choice', 'tools', 'top_logprobs', 'top_p', 'top_k', 'truncation', 'user',
        'skip_special_tokens', 'include_stop_str_in_output', 'presence_penalty', 'frequency_penalty',
        'prompt_cache_key', 'watermarking', 'request_id', 'session_id', 'media_io_kwargs',
        'mm_processor_kwargs', 'priority', 'cache_salt', 'enable_response_messages',
        'previous_input_messages', 'structured_outputs', 'repetition_penalty', 'seed', 'stop',
        'ignore_eos', 'vllm_xargs', 'kv_transfer_params', 'ec_transfer_params', 'chat_template_kwargs'
    ),
    'AnthropicMessagesRequest': (
        'model', 'messages', 'max_tokens', 'metadata', 'output_config', 'stop_sequences', 'stream',
        'system', 'temperature', 'tool_choice', 'tools', 'top_k', 'top_p', 'kv_transfer_params',
        'chat_template_kwargs'
    ),
    'AnthropicCountTokensRequest': (
        'model', 'messages', 'system', 'tool_choice', 'tools', 'chat_template_kwargs'
    ),
    'StreamOptions': (
        'include_usage', 'continuous_usage_stats'
    ),
    'SamplingParams': (
        'n', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'temperature', 'top_p',
        'top_k', 'min_p', 'seed', 'stop', 'stop_token_ids', 'ignore_eos', 'max_tokens',
        'min_tokens', 'logprobs', 'prompt_logprobs', 'prompt_logprob_token_ids',
        'prompt_logprob_start', 'logprob_token_ids', 'flat_logprobs', 'detokenize',
        'skip_special_tokens', 'spaces_between_special_tokens', 'include_stop_str_in_output',
        'output_kind', 'stream_interval', 'skip_clone', 'output_text_buffer_length',
        'structured_outputs', 'logit_bias', 'allowed_token_ids', 'extra_args', 'bad_words',
        'skip_reading_prefix_cache', 'thinking_token_budget', 'repetition_detection',
        'routed_experts_prompt_start', 'trace_decode_token_ids', 'truncate_prompt_tokens'
    ),
}
