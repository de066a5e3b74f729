package gateway

// KnownFields is an endpoint's table of known request fields ("chat" or
// "completions"): each field's name and what the server does with it
// ("honoured", "accepted" or "refused").
func KnownFields(endpoint string) map[string]string {
	fields := chatFields
	if endpoint == "completions" {
		fields = completionFields
	}
	m := map[string]string{}
	for _, f := range fields {
		m[f.name] = f.use.String()
	}
	return m
}
