"""Where each request field ringllm implements is proven: the tests that observe its effect.

The server's own table (``engine/entrypoints/openai/field_support.py``) places the fields it
refuses or ignores; every other field vLLM knows must be declared by the request struct and
listed here with at least one test, so a field cannot be claimed without evidence.
tests/integration/test_field_support.py checks that each named test exists and that together
the two tables place every field of vLLM's list.
"""

from __future__ import annotations

from engine.entrypoints.openai.field_support import PLACEMENT
from engine.entrypoints.openai.vllm_fields import VLLM_FIELDS

Tests = tuple[str, ...]  # "tests/file.py::test_name": each observes the field's effect


def _impl(*tests: str) -> Tests:
    return tests


_FIELDS = "tests/integration/test_request_fields.py::"
_SERVER = "tests/integration/test_openai_server.py::"
_SAMPLER = "tests/unit/test_sampler.py::"
_MAPPING = _FIELDS + "test_sampling_fields_reach_the_engine"
_TEMPLATES = "tests/integration/test_chat_template_limits.py::"
_TOOLS = "tests/integration/test_tool_calling.py::"
_SO = "tests/integration/test_structured_outputs_http.py::"
_SCORING = "tests/integration/test_scoring.py::"
_RESPONSES = "tests/integration/test_responses_api.py::"
_MESSAGES = "tests/integration/test_messages_api.py::"
_SHARED_POOLING = _impl(_SCORING + "test_shared_pooling_fields_act_on_classify_score_and_rerank")
_SCORE_FORMS = _impl(
    _SCORING + "test_score_is_the_cosine_of_the_embeddings", _SCORING + "test_bad_input_is_a_400_naming_the_field"
)

# What /v1/completions and /v1/chat/completions share.
_GENERATION: dict[str, Tests] = {
    "model": _impl(_SERVER + "test_unknown_model_is_404"),
    "n": _impl(_SERVER + "test_batch_of_prompts_with_n_numbers_choices_prompt_major"),
    "temperature": _impl(_MAPPING, _SAMPLER + "test_random_sampling_follows_the_distribution_and_the_masks"),
    "top_p": _impl(_MAPPING, _SAMPLER + "test_top_p_keeps_the_smallest_set_reaching_p"),
    "top_k": _impl(_MAPPING, _SAMPLER + "test_top_k_keeps_exactly_the_k_largest_per_row"),
    "min_p": _impl(_MAPPING, _SAMPLER + "test_min_p_drops_tokens_below_a_fraction_of_the_top_probability"),
    "repetition_penalty": _impl(_MAPPING, _SAMPLER + "test_repetition_penalty_steers_greedy_away_from_seen_tokens"),
    "presence_penalty": _impl(_MAPPING, _SAMPLER + "test_penalties_change_logits_exactly_as_specified"),
    "frequency_penalty": _impl(_MAPPING, _SAMPLER + "test_penalties_change_logits_exactly_as_specified"),
    "seed": _impl(_MAPPING, _SAMPLER + "test_seeded_request_is_reproducible_across_batch_compositions"),
    "stop": _impl(_SERVER + "test_stop_string_cuts_the_text_before_it"),
    "stop_token_ids": _impl(_FIELDS + "test_stop_token_ids_and_min_tokens_over_http"),
    "min_tokens": _impl(_FIELDS + "test_stop_token_ids_and_min_tokens_over_http"),
    "ignore_eos": _impl(
        _MAPPING, "tests/unit/test_scheduler.py::test_eos_stops_unless_ignored_and_stop_token_sets_stop_reason"
    ),
    "include_stop_str_in_output": _impl(
        _MAPPING,
        "tests/unit/test_output_processor.py::"
        "test_stop_string_spanning_tokens_ends_the_request_and_asks_the_core_to_abort",
    ),
    "skip_special_tokens": _impl(_MAPPING, "tests/unit/test_detokenizer.py::test_same_pieces_as_decode_stream"),
    "stream": _impl(_SERVER + "test_streamed_completion_concatenates_to_the_whole_one"),
    "stream_options": _impl(
        _SERVER + "test_streamed_completion_concatenates_to_the_whole_one",
        _FIELDS + "test_stream_options_without_stream_is_400",
    ),
    "max_tokens": _impl(
        _SERVER + "test_completion_reports_text_finish_reason_and_usage",
        _FIELDS + "test_max_tokens_beyond_the_context_is_400",
    ),
    "use_beam_search": _impl(_FIELDS + "test_use_beam_search_gives_the_beams_llm_beam_search_finds"),
    "length_penalty": _impl(
        _FIELDS + "test_use_beam_search_gives_the_beams_llm_beam_search_finds",
        _FIELDS + "test_length_penalty_divides_the_score_by_length_to_its_power",
    ),
    "logit_bias": _impl(_SO + "test_logit_bias_allowed_token_ids_and_bad_words"),
    "allowed_token_ids": _impl(_SO + "test_logit_bias_allowed_token_ids_and_bad_words"),
    "bad_words": _impl(_SO + "test_logit_bias_allowed_token_ids_and_bad_words"),
    "response_format": _impl(
        _SO + "test_response_format_json_schema_strict",
        _SO + "test_response_format_json_object_and_text",
        _TOOLS + "test_auto_and_none_answer_in_the_response_format",
    ),
    "structured_outputs": _impl(_SO + "test_structured_outputs_field_on_completions_and_chat_streams"),
    "truncate_prompt_tokens": _impl(_FIELDS + "test_truncate_prompt_tokens_keeps_the_chosen_side"),
    "truncation_side": _impl(_FIELDS + "test_truncate_prompt_tokens_keeps_the_chosen_side"),
    "prompt_logprobs": _impl(_FIELDS + "test_prompt_logprobs_without_echo_and_in_chat"),
    "return_tokens_as_token_ids": _impl(_FIELDS + "test_return_tokens_as_token_ids_in_logprobs"),
    "return_token_ids": _impl(_FIELDS + "test_return_token_ids_whole_and_streamed"),
    "priority": _impl(_FIELDS + "test_priority_needs_the_priority_policy_and_is_honoured"),
    "request_id": _impl(_FIELDS + "test_request_id_and_the_x_request_id_header"),
    "cache_salt": _impl(
        _FIELDS + "test_cache_salt_separates_prefix_cache_hits", _FIELDS + "test_salted_blocks_hash_apart"
    ),
    "add_special_tokens": _impl(_FIELDS + "test_add_special_tokens_adds_the_tokenizers_bos_or_not"),
    "stream_interval": _impl(_FIELDS + "test_stream_interval_batches_the_streamed_tokens"),
}
COMPLETION: dict[str, Tests] = {
    **_GENERATION,
    "prompt": _impl(_SERVER + "test_completion_reports_text_finish_reason_and_usage"),
    "echo": _impl(
        _SERVER + "test_token_id_prompt_with_echo_and_logprobs",
        _SERVER + "test_echo_with_max_tokens_0_answers_the_prompt_and_its_logprobs",
    ),
    "logprobs": _impl(_SERVER + "test_token_id_prompt_with_echo_and_logprobs"),
}
CHAT: dict[str, Tests] = {
    **_GENERATION,
    "messages": _impl(_SERVER + "test_chat_completion_uses_the_tokenizer_chat_template"),
    "max_completion_tokens": _impl(_SERVER + "test_streamed_chat_opens_with_the_role_and_ends_with_finish_reason"),
    "logprobs": _impl(_SERVER + "test_chat_n_and_logprobs"),
    "top_logprobs": _impl(_SERVER + "test_chat_n_and_logprobs"),
    "echo": _impl(_FIELDS + "test_chat_echo_starts_with_the_assistant_message"),
    "include_reasoning": _impl("tests/integration/test_reasoning.py::test_chat_reasoning_split_streamed_and_whole"),
    "reasoning_effort": _impl(_FIELDS + "test_documents_reasoning_effort_and_return_prompt_text"),
    "documents": _impl(_FIELDS + "test_documents_reasoning_effort_and_return_prompt_text"),
    "return_prompt_text": _impl(_FIELDS + "test_documents_reasoning_effort_and_return_prompt_text"),
    "tools": _impl(
        _TOOLS + "test_tools_and_a_tool_call_history_reach_the_chat_template",
        _TOOLS + "test_required_gives_calls_of_the_tools_streamed_and_not",
    ),
    "tool_choice": _impl(
        _TOOLS + "test_required_gives_calls_of_the_tools_streamed_and_not",
        _TOOLS + "test_named_choice_calls_that_function_streamed_and_not",
        _TOOLS + "test_a_forced_call_takes_the_place_of_a_response_format",
    ),
    "parallel_tool_calls": _impl(_TOOLS + "test_parallel_tool_calls_false_gives_one_call"),
    "chat_template": _impl(_TEMPLATES + "test_a_request_chat_template_is_rendered"),
    "continue_final_message": _impl(_TEMPLATES + "test_continue_final_message_leaves_the_last_message_open"),
    "add_generation_prompt": _impl(_FIELDS + "test_add_generation_prompt_changes_the_prompt"),
    "chat_template_kwargs": _impl(_TEMPLATES + "test_chat_template_kwargs_override_the_named_arguments_as_in_vllm"),
}
EMBEDDING: dict[str, Tests] = {
    "model": _impl("tests/integration/test_pooling.py::test_openai_client_embeddings_match_transformers"),
    "input": _impl("tests/integration/test_pooling.py::test_openai_client_embeddings_match_transformers"),
    "encoding_format": _impl("tests/integration/test_pooling.py::test_openai_client_embeddings_match_transformers"),
    "endianness": _impl(_FIELDS + "test_embedding_dtype_endianness_and_activation"),
    "embed_dtype": _impl(_FIELDS + "test_embedding_dtype_endianness_and_activation"),
    "use_activation": _impl(_FIELDS + "test_embedding_dtype_endianness_and_activation"),
    "truncate_prompt_tokens": _impl(_FIELDS + "test_embedding_truncation_salt_priority_and_request_id"),
    "truncation_side": _impl(_FIELDS + "test_embedding_truncation_salt_priority_and_request_id"),
    "request_id": _impl(_FIELDS + "test_embedding_truncation_salt_priority_and_request_id"),
    "priority": _impl(_FIELDS + "test_embedding_truncation_salt_priority_and_request_id"),
    "cache_salt": _impl(_FIELDS + "test_embedding_truncation_salt_priority_and_request_id"),
    "add_special_tokens": _GENERATION["add_special_tokens"],
}
# vLLM's PoolingBasicRequestMixin + ClassifyRequestMixin: what every pooling and scoring route takes.
POOLING_BASIC: dict[str, Tests] = {
    "model": _impl(_SCORING + "test_classify_matches_transformers_in_float32"),
    **{
        name: _SHARED_POOLING
        for name in (
            "use_activation",
            "truncate_prompt_tokens",
            "truncation_side",
            "request_id",
            "priority",
            "cache_salt",
        )
    },
}
CLASSIFICATION: dict[str, Tests] = {
    **POOLING_BASIC,
    "input": _impl(_SCORING + "test_classify_matches_transformers_in_float32"),
    "add_special_tokens": _GENERATION["add_special_tokens"],
}
POOLING: dict[str, Tests] = {
    **EMBEDDING,
    "model": _impl(_SCORING + "test_pooling_returns_what_the_model_pools"),
    "input": _impl(_SCORING + "test_pooling_returns_what_the_model_pools"),
    "encoding_format": _impl(_SCORING + "test_pooling_returns_what_the_model_pools"),
    "task": _impl(
        _SCORING + "test_pooling_returns_what_the_model_pools", _SCORING + "test_bad_input_is_a_400_naming_the_field"
    ),
}
SCORE: dict[str, Tests] = {
    **POOLING_BASIC,
    **{name: _SCORE_FORMS for name in ("text_1", "text_2", "queries", "documents", "items", "data_1", "data_2")},
}
RERANK: dict[str, Tests] = {
    **POOLING_BASIC,
    **{
        name: _impl(_SCORING + "test_rerank_orders_documents_by_score_and_keeps_top_n")
        for name in ("query", "documents", "top_n")
    },
}
RESPONSES: dict[str, Tests] = {
    "input": _impl(_RESPONSES + "test_string_and_item_input_with_instructions"),
    "instructions": _impl(_RESPONSES + "test_string_and_item_input_with_instructions"),
    "model": _impl(_RESPONSES + "test_string_and_item_input_with_instructions"),
    "max_output_tokens": _impl(_RESPONSES + "test_usage_and_max_output_tokens_make_an_incomplete_response"),
    "ignore_eos": _impl(_RESPONSES + "test_usage_and_max_output_tokens_make_an_incomplete_response"),
    "temperature": _impl(_RESPONSES + "test_seed_temperature_and_top_p_reach_the_sampler"),
    "top_p": _impl(_RESPONSES + "test_seed_temperature_and_top_p_reach_the_sampler"),
    "seed": _impl(_RESPONSES + "test_seed_temperature_and_top_p_reach_the_sampler"),
    "tools": _impl(_RESPONSES + "test_function_tool_round_trip_with_function_call_output"),
    "tool_choice": _impl(_RESPONSES + "test_function_tool_round_trip_with_function_call_output"),
    "parallel_tool_calls": _impl(_RESPONSES + "test_function_tool_round_trip_with_function_call_output"),
    "text": _impl(_RESPONSES + "test_text_format_json_schema_gives_json_of_the_schema"),
    "stream": _impl(_RESPONSES + "test_stream_events_in_order_and_deltas_join_to_the_text"),
    "store": _impl(_RESPONSES + "test_retrieve_and_previous_response_id_continue_a_stored_conversation"),
    "previous_response_id": _impl(_RESPONSES + "test_retrieve_and_previous_response_id_continue_a_stored_conversation"),
    "metadata": _impl(_RESPONSES + "test_retrieve_and_previous_response_id_continue_a_stored_conversation"),
    "background": _impl(_RESPONSES + "test_background_response_is_polled_and_cancelled"),
    "reasoning": _impl("tests/integration/test_reasoning.py::test_reasoning_effort_reaches_the_template"),
    "logit_bias": _impl("tests/integration/test_reasoning.py::test_responses_reasoning_item_streamed_and_whole"),
}
# What both Anthropic routes read (the conversation and its tools).
_CONVERSATION: dict[str, Tests] = {
    "model": _impl(_MESSAGES + "test_create_with_system_reports_usage_as_tokenize_counts"),
    "messages": _impl(_MESSAGES + "test_create_with_system_reports_usage_as_tokenize_counts"),
    "system": _impl(_MESSAGES + "test_create_with_system_reports_usage_as_tokenize_counts"),
    "tools": _impl(_MESSAGES + "test_forced_tool_use_and_a_tool_result_round_trip"),
    "tool_choice": _impl(_MESSAGES + "test_forced_tool_use_and_a_tool_result_round_trip"),
    "chat_template_kwargs": _impl(_MESSAGES + "test_count_tokens_counts_the_conversation_and_its_template_kwargs"),
}
MESSAGES: dict[str, Tests] = {
    **_CONVERSATION,
    "max_tokens": _impl(_MESSAGES + "test_max_tokens_and_stop_sequences_give_their_stop_reasons"),
    "stop_sequences": _impl(_MESSAGES + "test_max_tokens_and_stop_sequences_give_their_stop_reasons"),
    "stream": _impl(_MESSAGES + "test_stream_events_in_order_and_deltas_join_to_the_message"),
    "temperature": _impl(_MESSAGES + "test_temperature_top_p_and_top_k_reach_the_sampler"),
    "top_p": _impl(_MESSAGES + "test_temperature_top_p_and_top_k_reach_the_sampler"),
    "top_k": _impl(_MESSAGES + "test_temperature_top_p_and_top_k_reach_the_sampler"),
    "output_config": _impl(_MESSAGES + "test_output_config_format_gives_json_of_the_schema"),
}
COUNT_TOKENS: dict[str, Tests] = {
    **_CONVERSATION,
}
STREAM_OPTIONS: dict[str, Tests] = {
    "include_usage": _impl(
        _SERVER + "test_streamed_completion_concatenates_to_the_whole_one",
        _FIELDS + "test_streamed_usage_reports_cached_prompt_tokens_as_the_whole_one_does",
    ),
    "continuous_usage_stats": _impl(
        _FIELDS + "test_continuous_usage_stats_in_every_chunk",
        _FIELDS + "test_continuous_usage_starts_at_the_chat_role_chunk",
    ),
}

# SamplingParams fields whose effect a test observes through the engine (LLM), not over HTTP.
_ENGINE_TESTS = {
    "truncate_prompt_tokens": _FIELDS + "test_llm_truncates_prompts_and_refuses_multi_modal_data",
    "stream_interval": _FIELDS + "test_stream_interval_batches_the_streamed_tokens",
    "skip_reading_prefix_cache": _FIELDS + "test_llm_truncates_prompts_and_refuses_multi_modal_data",
    "detokenize": "tests/unit/test_output_processor.py::test_detokenize_false_gives_token_ids_only",
    "output_kind": "tests/integration/test_async_llm.py::"
    "test_delta_concatenates_to_cumulative_and_final_only_yields_once",
    "structured_outputs": "tests/integration/test_structured_outputs.py::"
    "test_every_constraint_type_is_matched_by_every_output",
    "logprobs": _SAMPLER + "test_logprobs_are_raw_with_ranks_of_the_sampled_token",
    "logit_bias": "tests/integration/test_logit_controls.py::test_logit_bias_forces_a_token",
    "allowed_token_ids": "tests/integration/test_logit_controls.py::test_allowed_token_ids_are_the_only_ones_sampled",
    "bad_words": "tests/integration/test_logit_controls.py::test_bad_words_are_never_generated",
}
# Every SamplingParams field vLLM has that the server's table does not refuse or ignore.
SAMPLING_PARAMS: dict[str, Tests] = {
    name: _impl(
        "tests/integration/test_field_support.py::test_sampling_params_fields_are_implemented_by_the_struct",
        *([_ENGINE_TESTS[name]] if name in _ENGINE_TESTS else [t for t in _GENERATION.get(name, ()) if t != _MAPPING]),
    )
    for name in VLLM_FIELDS["SamplingParams"]
    if name not in PLACEMENT["SamplingParams"]
}

IMPLEMENTED: dict[str, dict[str, Tests]] = {
    "ChatCompletionRequest": CHAT,
    "CompletionRequest": COMPLETION,
    "EmbeddingRequest": EMBEDDING,
    "StreamOptions": STREAM_OPTIONS,
    "SamplingParams": SAMPLING_PARAMS,
    "ResponsesRequest": RESPONSES,
    "PoolingRequest": POOLING,
    "ClassificationRequest": CLASSIFICATION,
    "ScoreRequest": SCORE,
    "RerankRequest": RERANK,
    "AnthropicMessagesRequest": MESSAGES,
    "AnthropicCountTokensRequest": COUNT_TOKENS,
}
