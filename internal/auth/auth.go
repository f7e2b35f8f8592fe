// Package auth is repeatrate's HTTP token store: bearer tokens kept only as SHA-256 hashes, each
// granting read or read-write access to named workspaces. The read side checks read; an HTTP
// ingest checks write. A token is never stored, logged or echoed; only its name is.
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Perm is what a token may do in one workspace.
type Perm uint8

// Permissions; Write implies nothing about Read, so a grant names what it needs ("read-write").
const (
	Read Perm = 1 << iota
	Write
)

// String is the permission's configuration text: read, write or read-write.
func (p Perm) String() string {
	switch p {
	case Read:
		return "read"
	case Write:
		return "write"
	case Read | Write:
		return "read-write"
	}
	return "none"
}

// ParsePerm reads read, write or read-write (rw).
func ParsePerm(s string) (Perm, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "read", "r":
		return Read, nil
	case "write", "w":
		return Write, nil
	case "read-write", "rw", "write-read":
		return Read | Write, nil
	}
	return 0, fmt.Errorf("permission %q is not read, write or read-write", s)
}

// AllWorkspaces is the grant key that covers every workspace (an operator's token).
const AllWorkspaces = "*"

// TokenConfig is one configured token: a name for logs and metrics, the hex SHA-256 of the token
// (never the token itself), and its grants by workspace.
type TokenConfig struct {
	Name       string            `yaml:"name"`
	SHA256     string            `yaml:"sha256"`
	Workspaces map[string]string `yaml:"workspaces"`
}

// Principal is an authenticated token.
type Principal struct {
	Name   string
	grants map[string]Perm
}

// Can reports whether p holds perm in workspace ws.
func (p *Principal) Can(ws string, perm Perm) bool {
	if p == nil {
		return false
	}
	return p.grants[ws]&perm == perm || p.grants[AllWorkspaces]&perm == perm
}

// Workspaces lists the workspaces p holds perm in, sorted; "*" means every one.
func (p *Principal) Workspaces(perm Perm) []string {
	var out []string
	for ws, g := range p.grants {
		if g&perm == perm {
			out = append(out, ws)
		}
	}
	slices.Sort(out)
	return out
}

// Store maps token hashes to principals. The zero Store knows no token.
type Store struct {
	byHash map[[sha256.Size]byte]*Principal
}

// Hash returns the hex SHA-256 of a token: what configuration holds.
func Hash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// NewStore checks every token configuration and returns the store; its error names each mistake
// by token name, never by hash.
func NewStore(tokens []TokenConfig) (*Store, error) {
	s := &Store{byHash: map[[sha256.Size]byte]*Principal{}}
	var errs []error
	names := map[string]bool{}
	for i, t := range tokens {
		name := t.Name
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
			errs = append(errs, fmt.Errorf("token %s: name is required", name))
		}
		if names[t.Name] {
			errs = append(errs, fmt.Errorf("token %s: name used twice", name))
		}
		names[t.Name] = true
		raw, err := hex.DecodeString(strings.TrimSpace(t.SHA256))
		if err != nil || len(raw) != sha256.Size {
			errs = append(errs, fmt.Errorf("token %s: sha256 must be 64 hex digits (the SHA-256 of the token, e.g. `printf %%s \"$TOKEN\" | sha256sum`)", name))
			continue
		}
		var h [sha256.Size]byte
		copy(h[:], raw)
		if _, dup := s.byHash[h]; dup {
			errs = append(errs, fmt.Errorf("token %s: the same token is configured twice", name))
		}
		if len(t.Workspaces) == 0 {
			errs = append(errs, fmt.Errorf("token %s: grants no workspace", name))
		}
		p := &Principal{Name: t.Name, grants: map[string]Perm{}}
		for ws, perm := range t.Workspaces {
			g, err := ParsePerm(perm)
			if err != nil {
				errs = append(errs, fmt.Errorf("token %s: workspace %q: %w", name, ws, err))
			}
			if ws == "" {
				errs = append(errs, fmt.Errorf("token %s: empty workspace name", name))
			}
			p.grants[ws] = g
		}
		s.byHash[h] = p
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return s, nil
}

// ParseTokens reads the compact form used in environment variables:
// "name:sha256:ws=read,ws2=read-write;name2:…". Whitespace around parts is ignored.
func ParseTokens(s string) ([]TokenConfig, error) {
	var out []TokenConfig
	for _, entry := range strings.Split(s, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		parts := strings.SplitN(entry, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("token entry %d: want name:sha256:workspace=perm,…", len(out)+1)
		}
		t := TokenConfig{Name: strings.TrimSpace(parts[0]), SHA256: strings.TrimSpace(parts[1]), Workspaces: map[string]string{}}
		for _, g := range strings.Split(parts[2], ",") {
			ws, perm, ok := strings.Cut(strings.TrimSpace(g), "=")
			if !ok {
				return nil, fmt.Errorf("token %s: grant %q is not workspace=perm", t.Name, g)
			}
			t.Workspaces[ws] = perm
		}
		out = append(out, t)
	}
	return out, nil
}

// Len is the number of tokens.
func (s *Store) Len() int {
	if s == nil {
		return 0
	}
	return len(s.byHash)
}

// Lookup returns the principal of a presented token, or nil. The token is hashed and looked up by
// hash: the time taken depends on the hash, which tells an attacker nothing about stored tokens.
func (s *Store) Lookup(token string) *Principal {
	if s == nil || token == "" {
		return nil
	}
	h := sha256.Sum256([]byte(token))
	p := s.byHash[h]
	if p == nil {
		return nil
	}
	return p
}

// Bearer returns the token of an "Authorization: Bearer <token>" header, or "".
func Bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) < 7 || !strings.EqualFold(h[:7], "bearer ") {
		return ""
	}
	return strings.TrimSpace(h[7:])
}

// MatchHash reports, in constant time, whether token hashes to the hex SHA-256 want (for single
// tokens such as the metrics token). An empty want matches nothing.
func MatchHash(token, want string) bool {
	if want == "" || token == "" {
		return false
	}
	got := Hash(token)
	return subtle.ConstantTimeCompare([]byte(got), []byte(strings.ToLower(strings.TrimSpace(want)))) == 1
}
