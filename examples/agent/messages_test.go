package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestOperatorMessages: a size without a unit and a bad --cpu-affinity are
// usage errors in the operator's words: one line, the agent's name first,
// the flag as given once, no library prefix, pointing at --help.
func TestOperatorMessages(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--gpu-memory", "4096", "--", "true"}, "agent: --gpu-memory 4096: a size needs a unit, such as 4096MiB or 4GiB"},
		{[]string{"--cpu-affinity", "bogus", "--", "true"}, `agent: --cpu-affinity "bogus": want numa`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, nil, &stdout, &stderr)
		msg := stderr.String()
		if code != 125 || strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, tc.want) || !strings.HasSuffix(msg, "(see agent --help)\n") ||
			strings.Contains(msg, "invalid") || strings.Count(msg, tc.args[0]) != 1 {
			t.Errorf("agent %q: exit %d, stderr %q; want 125 and one line starting %q", tc.args, code, msg, tc.want)
		}
	}
}
