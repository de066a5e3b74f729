package tokenizer

// Fill-in-the-middle: the three tokens a code model is trained to read as
// "the text before the hole, the text after it, now write the middle"
// (prefix-suffix-middle order, as llama.cpp's infill builds it).

// FIM holds a vocabulary's fill-in-the-middle token ids.
type FIM struct{ Pre, Suf, Mid int }

// fimSpellings are the token texts of the FIM tokens in the families that
// ship them, tried when the GGUF file does not name the ids
// (tokenizer.ggml.fim_*_token_id, or the older prefix/suffix/middle keys),
// as llama.cpp does.
var fimSpellings = [][3]string{
	{"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}, // Qwen 2.5 Coder
	{"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},       // StarCoder, Granite
	{"<fim-prefix>", "<fim-suffix>", "<fim-middle>"},
	{"▁<PRE>", "▁<SUF>", "▁<MID>"}, // CodeLlama
	{"<PRE>", "<SUF>", "<MID>"},
	{"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"}, // DeepSeek Coder
}

// setFIM takes the ids the file names, if all three are in the
// vocabulary, else the first family of spellings found whole.
func (t *Tokenizer) setFIM(v Vocab) {
	in := func(id *int) bool { return id != nil && *id >= 0 && *id < len(t.tokens) }
	if in(v.FIMPre) && in(v.FIMSuf) && in(v.FIMMid) {
		t.fim, t.hasFIM = FIM{*v.FIMPre, *v.FIMSuf, *v.FIMMid}, true
		return
	}
	for _, sp := range fimSpellings {
		pre, ok1 := t.ids[sp[0]]
		suf, ok2 := t.ids[sp[1]]
		mid, ok3 := t.ids[sp[2]]
		if ok1 && ok2 && ok3 {
			t.fim, t.hasFIM = FIM{int(pre), int(suf), int(mid)}, true
			return
		}
	}
}

// FIM returns the fill-in-the-middle tokens; ok is false when the
// vocabulary has no complete set (the model was not trained for it).
func (t *Tokenizer) FIM() (f FIM, ok bool) { return t.fim, t.hasFIM }
