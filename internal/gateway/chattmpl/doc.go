// Package chattmpl renders GGUF chat templates (tokenizer.chat_template):
// a bounded interpreter for the subset of Jinja2 that real chat templates
// use, evaluated the way Hugging Face's apply_chat_template does
// (trim_blocks and lstrip_blocks on, loop controls enabled).
//
// It promises that rendering a template from an untrusted model file is
// safe: there is no file access (no include, import or extends), no
// attribute access to Go values, and every run is bounded in steps, output
// size, range length and nesting depth, so a hostile template fails with
// an error instead of exhausting the server.
//
// Supported: {{ }}, {% if/elif/else %}, {% for x in y [if c] %} with
// else, loop.index/index0/revindex/revindex0/first/last/length/previtem/
// nextitem, {% set %} (including namespace attributes), break/continue,
// {% macro %} (parameters with defaults, called by position or name,
// recursion bounded),
// {% generation %} blocks (transparent), comments, whitespace control
// (- and +), literals (strings, numbers, lists, dicts, tuples, booleans,
// none), arithmetic, ~, comparisons, in, and/or/not, conditional
// expressions, slicing, the tests (defined, none, string, number, mapping,
// sequence, iterable, boolean, true, false, odd, even, ...), the common
// filters (trim, upper, lower, length, first, last, join, default,
// tojson, replace, selectattr, rejectattr, map, items, list, string, int,
// ...), string methods (strip, split, startswith, ...), dict methods
// (items, keys, values, get) and the globals raise_exception, namespace,
// range and strftime_now. Anything else is a parse or render error; the
// gateway then uses Fallback.
package chattmpl
