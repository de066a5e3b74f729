// Package tokenizer turns text into token ids and back for the models the
// engine serves, producing exactly the ids llama.cpp (build b4748) produces
// for the same vocabulary, so that prompts, prefix-cache keys and goldens
// agree token for token.
//
// Three families are supported:
//
//   - SentencePiece BPE ("SPM", GGUF tokenizer.ggml.model = "llama"): spaces
//     become U+2581, a U+2581 prefix is added when add_space_prefix is set
//     (the default), adjacent symbols are merged best score first, and
//     characters no token covers fall back to byte tokens <0xNN>. This is
//     llama.cpp's llm_tokenizer_spm.
//   - byte-level BPE ("gpt2"): the text is split by the pre-tokenizer that
//     tokenizer.ggml.pre names (gpt-2, llama3, qwen2, deepseek-llm,
//     deepseek-coder, falcon, mpt, starcoder, refact, ...), each piece is
//     mapped through GPT-2's byte-to-unicode table and merged by merge rank.
//     The pre-tokenizer regexes are implemented by hand over Unicode
//     categories (Go's regexp has no lookahead); each mirrors the matcher
//     llama.cpp runs for that regex, std::regex quirks included.
//   - llama2.c's tokenizer.bin: Encode is run.c's encode (dummy-prefix " "
//     token, codepoint lookup with byte fallback id = byte+3, then repeated
//     merging of the best-scoring adjacent pair) and Decode is run.c's decode.
//
// WordPiece ("bert"), Unigram ("t5") and RWKV vocabularies are refused with
// an error wrapping ErrUnsupported.
//
// Before a model's own algorithm runs, Encode cuts the text at the literal
// text of special tokens as llama.cpp's tokenizer_st_partition does:
// user-defined tokens always, control and unknown tokens only when
// parseSpecial is set. Longer special tokens are cut first.
//
// Decoding is the concatenation of each token's Piece: the bytes it
// contributes to the output. Control and unknown tokens contribute nothing.
// A piece that directly follows BOS loses one leading space in vocabularies
// that add a space prefix (SPM, llama2.c), so that Decode(Encode(x, true,
// false)) == x for SPM; without BOS the prefix space stays, as llama.cpp's
// token pieces keep it. Decode does not apply llama.cpp's BPE "clean
// spaces" pass (" ," → ","): it is the exact concatenation of the pieces,
// which is also what a stream of generated tokens shows. StreamDecoder turns a stream of token ids into valid
// UTF-8 text, holding back an incomplete multi-byte character until the
// token that completes it arrives.
//
// A Tokenizer is immutable after construction and safe for concurrent use.
// No input, from text or from a file, makes it panic.
package tokenizer
