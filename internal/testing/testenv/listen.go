package testenv

import (
	"net"
	"testing"
)

// Listen listens on network and addr ("tcp" "127.0.0.1:0", "unix" PATH, or
// "unix" "@NAME" for an abstract socket) and accepts and closes every
// connection until tb ends: bait for a process that must not reach it.
func Listen(tb testing.TB, network, addr string) net.Listener {
	tb.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l
}
