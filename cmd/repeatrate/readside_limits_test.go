package main

import (
	"flag"
	"io"
	"testing"
)

// TestHTTPConnectionsPerAddress: behind a proxy or Ingress (how the README says to expose the
// read side) every client has the proxy's address, so the per-address cap of 32 was the whole
// server's, and 32 open event streams (64 are allowed) shut the proxy out. The cap can be raised.
func TestHTTPConnectionsPerAddress(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want int
	}{
		{nil, nil, 32},
		{[]string{"--http-max-connections-per-address", "256"}, nil, 256},
		{nil, map[string]string{"REPEATRATE_HTTP_MAX_CONNECTIONS_PER_ADDRESS": "128"}, 128},
	} {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg, err := loadConfig(fs, c.args, func(k string) string { return c.env[k] })
		if err != nil {
			t.Fatalf("%v %v: %v", c.args, c.env, err)
		}
		if cfg.HTTP.MaxConnectionsPerAddress != c.want {
			t.Errorf("%v %v: per-address cap %d, want %d", c.args, c.env, cfg.HTTP.MaxConnectionsPerAddress, c.want)
		}
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if _, err := loadConfig(fs, []string{"--http-max-connections-per-address", "0"}, func(string) string { return "" }); err == nil {
		t.Error("a per-address cap of 0 was accepted")
	}
}
