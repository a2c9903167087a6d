package conformance

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// process is a started run: its stderr read line by line, without tying
// its end to that of its container (which holds the same stderr).
type process struct {
	cmd     *exec.Cmd
	started chan struct{} // closed once a line says its container runs
	done    chan struct{} // closed once it has exited
	err     error         // Wait's, once done

	mu  sync.Mutex
	id  string
	out strings.Builder
}

// start starts cmd of inst.
func start(t *testing.T, inst instance, cmd *exec.Cmd) *process {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = w
	p := &process{cmd: cmd, started: make(chan struct{}), done: make(chan struct{})}
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	p.id, _ = inst.idOf(pid, "")
	var once sync.Once
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			id, ok := inst.idOf(pid, sc.Text())
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			if ok {
				p.id = id
			}
			p.mu.Unlock()
			if ok {
				once.Do(func() { close(p.started) })
			}
		}
	}()
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p
}

// ID names its container ("" while unknown).
func (p *process) ID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.id
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// kill SIGKILLs it and waits for it to end. It tells when it was killed:
// "start-up or launch", "run" (its container ran) or "ended N" (it had
// exited on its own with status N: 0, or 125 when it found too few free
// GPUs).
func (p *process) kill() string {
	phase := "start-up or launch"
	select {
	case <-p.done:
		return "ended " + strconv.Itoa(p.cmd.ProcessState.ExitCode())
	case <-p.started:
		phase = "run"
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
	if p.cmd.ProcessState.Exited() { // between the look and the kill
		return "ended " + strconv.Itoa(p.cmd.ProcessState.ExitCode())
	}
	return phase
}

// waitStarted waits until its container runs.
func (p *process) waitStarted(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-p.started:
	case <-p.done:
		t.Fatalf("run ended before its container ran: %v\n%s", p.err, p.output())
	case <-ctx.Done():
		t.Fatalf("its container never ran: %v\n%s", ctx.Err(), p.output())
	}
}

// wait waits until it ends on its own and fails t unless it exits 0.
func (p *process) wait(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-p.done:
	case <-ctx.Done():
		p.cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not end: %v\n%s", what, ctx.Err(), p.output())
		return
	}
	if p.err != nil {
		t.Errorf("%s: %v\n%s", what, p.err, p.output())
	}
}

// running reports whether it still runs.
func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}
