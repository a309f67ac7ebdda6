package kubetest

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// Forward accepts connections on l and relays each, bytes as they are, to
// the API server, until l is closed; it returns then. Tests use it to reach
// the server from another network namespace (a listener made inside a
// vpcsim router netns); a stopped API server closes relayed connections at
// once. Clients verify the serving certificate by name (see ConfigVia).
func (s *Server) Forward(l net.Listener) {
	target := strings.TrimPrefix(s.URL, "https://")
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			relay(c, target)
		}()
	}
}

func relay(c net.Conn, target string) {
	defer c.Close()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// ConfigVia returns a copy of cfg that reaches the API server at hostport
// (a Forward listener) and verifies its certificate as "localhost".
func ConfigVia(cfg *rest.Config, hostport string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Host = "https://" + hostport
	c.TLSClientConfig.ServerName = "localhost"
	return c
}
