package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// streamKind is one kind of pod of a claim stream: its claim template
// (made beforehand in the stream's namespace) and its node.
type streamKind struct{ template, node string }

// claimStream creates claim pods one after another, each kind in turn,
// until end: each pod runs the probe once and ends.
type claimStream struct {
	c      *cluster.Cluster
	ns     string
	mu     sync.Mutex
	pods   []string                   // every pod created
	kindOf map[string]streamKind      // each pod's kind
	ended  map[string]corev1.PodPhase // those that ended (then deleted)
	errs   []string
	cancel context.CancelFunc
	done   chan struct{}
}

// reap records the phase of every pod of the stream that ended, and
// deletes it: its claim is then free for the next pod.
func (s *claimStream) reap(ctx context.Context) {
	s.mu.Lock()
	live := []string{}
	for _, name := range s.pods {
		if _, ok := s.ended[name]; !ok {
			live = append(live, name)
		}
	}
	s.mu.Unlock()
	for _, name := range live {
		p, err := s.c.Client.CoreV1().Pods(s.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || (p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed) {
			continue
		}
		s.mu.Lock()
		s.ended[name] = p.Status.Phase
		s.mu.Unlock()
		s.c.Client.CoreV1().Pods(s.ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
}

func startStream(t *testing.T, c *cluster.Cluster, ns, prefix string, every time.Duration, kinds []streamKind) *claimStream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	s := &claimStream{c: c, ns: ns, cancel: cancel, done: make(chan struct{}), ended: map[string]corev1.PodPhase{}, kindOf: map[string]streamKind{}}
	go func() {
		defer close(s.done)
		for i := 0; ; i++ {
			s.reap(ctx)
			k := kinds[i%len(kinds)]
			name := fmt.Sprintf("%s-%d", prefix, i)
			p := onNode(in(ns, withClaim(probePod(name, []string{"do", "cwd"}), k.template)), k.node)
			_, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			s.mu.Lock()
			if err == nil {
				s.pods = append(s.pods, name)
				s.kindOf[name] = k
			} else if ctx.Err() == nil {
				s.errs = append(s.errs, fmt.Sprintf("create %s: %v", name, err))
			}
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
		}
	}()
	t.Cleanup(func() {
		s.end()
		for _, name := range s.pods {
			c.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	})
	return s
}

// end stops the stream and returns its pods' names.
func (s *claimStream) end() []string {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pods
}

// perKind counts the stream's pods of each kind ("template on node").
func (s *claimStream) perKind() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, k := range s.kindOf {
		out[k.template+" on "+k.node]++
	}
	return out
}

// check waits until every pod of the stream ran to its end (Succeeded) and
// counts the kubelet's FailedPrepareDynamicResources events of them (each
// failed prepare of a claim), reporting every pod that failed; the pods
// are deleted as they end.
func (s *claimStream) check(t *testing.T) (pods, failedPrepares int) {
	t.Helper()
	names := s.end()
	for _, e := range s.errs {
		t.Error(e)
	}
	until(t, "every stream pod to end", func() bool {
		s.reap(t.Context())
		return len(s.ended) == len(names)
	})
	for _, name := range names {
		if ph := s.ended[name]; ph != corev1.PodSucceeded {
			t.Errorf("stream pod %s: %s", name, ph)
		}
		evs, err := s.c.Client.CoreV1().Events(s.ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Items {
			if ev.Reason == "FailedPrepareDynamicResources" {
				failedPrepares += max(1, int(ev.Count))
				t.Errorf("stream pod %s: %s", name, strings.TrimSpace(ev.Message))
			}
		}
	}
	for _, name := range names {
		deleteIn(t, s.c, s.ns, name)
	}
	return len(names), failedPrepares
}
