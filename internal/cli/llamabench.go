package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pagewarden/pagewarden/internal/model"
)

// llamaBench runs a llama-bench binary the user built (bench
// --llama-bench PATH) on the same GGUF file, one test and one repetition
// per call, so that bench can interleave its repetitions with its own: a
// slow spell of a shared machine then hits both sides, and the ratio it
// prints compares like with like. Nothing of llama.cpp is part of this
// project; the binary and its build are the user's.
type llamaBench struct {
	path, model, kvType string
	commit              string // build_commit of the last run
}

// llamaBenchFile is the GGUF file llama-bench reads for mf: the model
// file itself, or a builtin model written to dir by the project's own
// GGUF writer. A llama2.c checkpoint has no GGUF to compare on.
func llamaBenchFile(mf *modelFlags, dir string) (string, error) {
	name, ok := strings.CutPrefix(mf.model, model.BuiltinPrefix)
	if !ok {
		if mf.tokenizer != "" || strings.HasSuffix(mf.model, ".bin") {
			return "", usagef("--llama-bench compares on a GGUF file: convert the checkpoint first (pagewarden convert)")
		}
		return mf.model, nil
	}
	spec, ok := model.Builtins[name]
	if !ok {
		return "", usagef("--model %q: have %s", mf.model, strings.Join(model.BuiltinNames(), ", "))
	}
	w, err := model.BuiltinGGUF(spec)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".gguf")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	_, err = w.WriteTo(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return path, err
}

// llamaResult is the part of one llama-bench JSON record bench reads.
type llamaResult struct {
	BuildCommit string  `json:"build_commit"`
	NPrompt     int     `json:"n_prompt"`
	NGen        int     `json:"n_gen"`
	NThreads    int     `json:"n_threads"`
	TypeK       string  `json:"type_k"`
	AvgTS       float64 `json:"avg_ts"`
}

// rate runs one llama-bench test (prompt tokens of prefill, or gen tokens
// of decode) once at threads and returns its tokens/s.
func (l *llamaBench) rate(ctx context.Context, threads, prompt, gen int) (float64, error) {
	args := []string{"-m", l.model, "-t", strconv.Itoa(threads), "-r", "1", "-o", "json",
		"-p", strconv.Itoa(prompt), "-n", strconv.Itoa(gen), "-ctk", l.kvType, "-ctv", l.kvType}
	cmd := exec.CommandContext(ctx, l.path, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s %s: %w\n%s", l.path, strings.Join(args, " "), err, lastLines(errb.String(), 5))
	}
	var rs []llamaResult
	if err := json.Unmarshal(out.Bytes(), &rs); err != nil {
		return 0, fmt.Errorf("%s printed no JSON test records (-o json): %w\n%s", l.path, err, lastLines(out.String(), 5))
	}
	for _, r := range rs {
		if r.NPrompt == prompt && r.NGen == gen && r.NThreads == threads {
			if !strings.EqualFold(r.TypeK, l.kvType) {
				return 0, fmt.Errorf("%s ran K/V %s, not the %s asked for", l.path, r.TypeK, l.kvType)
			}
			if r.AvgTS <= 0 {
				return 0, fmt.Errorf("%s reported %g tokens/s for pp%d tg%d", l.path, r.AvgTS, prompt, gen)
			}
			l.commit = r.BuildCommit
			return r.AvgTS, nil
		}
	}
	return 0, errors.New(l.path + ": no record for the test it was asked to run")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
