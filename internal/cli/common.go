package cli

import (
	"errors"
	"fmt"
	"github.com/pagewarden/pagewarden/internal/admin"
	"github.com/pagewarden/pagewarden/internal/gateway"
	"io"
	"log/slog"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pagewarden/pagewarden/internal/gateway/chattmpl"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/node"
)

// logFlags are --log-level and --log-format, shared by every serving
// command (serve, gateway, prefill, decode). Both are checked while the
// command line is parsed, so a bad value is a usage error and building the
// logger cannot fail.
type logFlags struct {
	level  levelValue
	format formatValue
}

func (f *logFlags) register(c *cobra.Command) {
	f.format = "json"
	c.Flags().Var(&f.level, "log-level", "least severe log level written: debug, info, warn or error")
	c.Flags().Var(&f.format, "log-format", "log line format: json or text (logfmt)")
}

// logger builds the command's structured logger writing to w.
func (f *logFlags) logger(w io.Writer) *slog.Logger {
	o := &slog.HandlerOptions{Level: slog.Level(f.level)}
	if f.format == "text" {
		return slog.New(slog.NewTextHandler(w, o))
	}
	return slog.New(slog.NewJSONHandler(w, o))
}

// levelValue is a slog.Level as a flag; its zero value is info.
type levelValue slog.Level

func (l *levelValue) String() string { return strings.ToLower(slog.Level(*l).String()) }
func (l *levelValue) Type() string   { return "level" }
func (l *levelValue) Set(s string) error {
	switch strings.ToLower(s) {
	case "debug":
		*l = levelValue(slog.LevelDebug)
	case "info":
		*l = levelValue(slog.LevelInfo)
	case "warn", "warning":
		*l = levelValue(slog.LevelWarn)
	case "error":
		*l = levelValue(slog.LevelError)
	default:
		return fmt.Errorf("want debug, info, warn or error")
	}
	return nil
}

// formatValue is json or text.
type formatValue string

func (v *formatValue) String() string { return string(*v) }
func (v *formatValue) Type() string   { return "format" }
func (v *formatValue) Set(s string) error {
	if s != "json" && s != "text" {
		return fmt.Errorf("want json or text")
	}
	*v = formatValue(s)
	return nil
}

var (
	_ pflag.Value = (*levelValue)(nil)
	_ pflag.Value = (*formatValue)(nil)
)

// registerAPIKey adds --api-key (serve, gateway).
func registerAPIKey(c *cobra.Command, key *string) {
	c.Flags().StringVar(key, "api-key", "", "serve one tenant (\"default\") with this API key instead of a generated one; not with --config (prefer PAGEWARDEN_API_KEY: a flag shows in the process list)")
}

// tenantConfig reads --config, or without one makes the default tenant:
// with --api-key's key, or with a generated one that it returns (to print
// once the server listens).
func tenantConfig(cmd *cobra.Command, path, apiKey string) (cfg *tenants.Config, key string, err error) {
	given := cmd.Flags().Changed("api-key")
	switch {
	case given && path != "":
		return nil, "", usagef("--api-key and --config cannot be used together: put the key's hash in the config (pagewarden keygen)")
	case given && apiKey == "":
		return nil, "", usagef("--api-key is empty")
	case given:
		return &tenants.Config{Tenants: []tenants.Tenant{{ID: tenants.DefaultTenantID, APIKeySHA256: []string{tenants.HashKey(apiKey)}}}}, "", nil
	case path == "":
		return tenants.Default()
	}
	cfg, err = loadTenants(path)
	return cfg, "", err
}

// servedFlags are --served-model-name and --chat-template (serve,
// gateway): what the API calls the model and how it formats chats.
type servedFlags struct {
	name, template string
}

func (f *servedFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.name, "served-model-name", "", "model id shown by /v1/models and in responses (default: the model's name)")
	c.Flags().StringVar(&f.template, "chat-template", "", "file holding a Jinja chat template to use instead of the model's own")
}

// maxChatTemplateBytes bounds --chat-template's file (templates in the
// wild are a few KiB).
const maxChatTemplateBytes = 1 << 20

// apply puts the flags into o, reading and checking the template file: a
// template the operator chose that does not parse stops the start, rather
// than falling back as an unusable built-in one does.
func (f *servedFlags) apply(cmd *cobra.Command, o *node.Options) error {
	if cmd.Flags().Changed("served-model-name") && strings.TrimSpace(f.name) == "" {
		return usagef("--served-model-name is empty")
	}
	o.ServedModelName = f.name
	if f.template == "" {
		return nil
	}
	file, err := os.Open(f.template)
	if err != nil {
		return usagef("--chat-template: %v", err)
	}
	defer file.Close()
	b, err := io.ReadAll(io.LimitReader(file, maxChatTemplateBytes+1))
	switch {
	case err != nil:
		return usagef("--chat-template %s: %v", f.template, err)
	case len(b) > maxChatTemplateBytes:
		return usagef("--chat-template %s: larger than %d bytes", f.template, maxChatTemplateBytes)
	case strings.TrimSpace(string(b)) == "" || !utf8.Valid(b):
		return usagef("--chat-template %s: want a non-empty UTF-8 template", f.template)
	}
	if _, err := chattmpl.Parse(string(b)); err != nil {
		return usagef("--chat-template %s: %v", f.template, err)
	}
	o.ChatTemplate = string(b)
	return nil
}

// reloadTenants is SIGHUP (and the admin API's reload): read --config
// again and swap it in, or keep the one in force and log why. It returns
// what changed (tenants.Diff).
func reloadTenants(srv *gateway.Server, path string, logger *slog.Logger) ([]string, error) {
	_, changes, err := reloadTenantConfig(srv, path, logger)
	return changes, err
}

// reloadTenantConfig is reloadTenants that also returns the config it
// put in force (for the admin keys).
func reloadTenantConfig(srv *gateway.Server, path string, logger *slog.Logger) (*tenants.Config, []string, error) {
	if path == "" {
		logger.Warn("SIGHUP ignored: no --config to reload")
		return nil, nil, errNoConfig
	}
	old := srv.Tenants()
	nc, err := loadTenants(path)
	if err == nil {
		err = srv.Reload(nc)
	}
	// Both outcomes are audit events (the admin page's ring keeps them):
	// who may use the server, and within what limits, changed or not.
	if err != nil {
		logger.Error("tenant config reload failed; keeping the old one", "err", err, admin.AuditKey, true)
		return nil, nil, err
	}
	changes := tenants.Diff(old, srv.Tenants())
	logger.Info("tenant config reloaded", "tenants", len(nc.Tenants), "changes", strings.Join(changes, "; "), admin.AuditKey, true)
	return nc, changes, nil
}

// errNoConfig: a reload without --config (one generated or --api-key
// tenant) has nothing to read.
var errNoConfig = errors.New("no --config to reload")

// announceKey prints a generated API key once, on the terminal (stderr),
// when the server is about to listen; nothing for a configured one.
func announceKey(cmd *cobra.Command, key string) {
	if key != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "no --config: one tenant %q; its API key (shown once): %s\n", tenants.DefaultTenantID, key)
	}
}
