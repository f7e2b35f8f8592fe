package aggregator

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"sync"

	"github.com/redis/go-redis/v9"
)

// FingerprintBytes is the length of an opportunity's fingerprint in state layout 11: the first 16
// bytes of HMAC-SHA-256 of its id under the namespace's secret. Keyed, the fingerprint of an id
// is unpredictable to whoever chooses ids, so ids cannot be aimed at one bucket of the packed
// record store, and two ids of one aggregate collide as under a random function: with n ids
// retained, with probability at most n²/2¹²⁹ (below 1.5·10⁻¹⁹ at n = 10¹⁰; docs/semantics.md).
const FingerprintBytes = 16

// fingerprintSecretBytes is the length of a namespace's fingerprint secret: 256 random bits, as
// many as HMAC-SHA-256's output, so guessing the secret is no easier than inverting the MAC.
const fingerprintSecretBytes = 32

// FingerprintKey is the key of namespace ns's fingerprint secret. It lives and dies with the
// namespace's state: fingerprints under another secret would find none of the records.
func FingerprintKey(ns string) string { return ns + ":fingerprint" }

// Fingerprinter computes opportunity fingerprints under one namespace's secret. It is safe for
// concurrent use, and nothing it prints shows the secret.
type Fingerprinter struct {
	macs sync.Pool // *fingerprintMAC under the secret, reset before each use
}

// fingerprintMAC is an HMAC-SHA-256 with the buffers Append writes the id and reads the sum
// through: pooled with it, so that a fingerprint allocates nothing.
type fingerprintMAC struct {
	h   hash.Hash
	id  []byte
	sum [sha256.Size]byte
}

func newFingerprinter(secret []byte) (*Fingerprinter, error) {
	if len(secret) != fingerprintSecretBytes {
		return nil, fmt.Errorf("fingerprint secret of %d bytes, want %d", len(secret), fingerprintSecretBytes)
	}
	key := append([]byte(nil), secret...)
	f := &Fingerprinter{}
	f.macs.New = func() any { return &fingerprintMAC{h: hmac.New(sha256.New, key)} }
	return f, nil
}

// Append appends the fingerprint of opportunity id to dst.
func (f *Fingerprinter) Append(dst []byte, id string) []byte {
	m := f.macs.Get().(*fingerprintMAC)
	m.h.Reset()
	m.id = append(m.id[:0], id...)
	m.h.Write(m.id)
	dst = append(dst, m.h.Sum(m.sum[:0])[:FingerprintBytes]...)
	if cap(m.id) > 4<<10 {
		m.id = nil // an id past the usual: not kept in the pool
	}
	f.macs.Put(m)
	return dst
}

// Format prints no secret, whatever the verb. (The zero Fingerprinter has no secret and must not
// be used: OpenFingerprint makes them.)
func (f *Fingerprinter) Format(s fmt.State, _ rune) { fmt.Fprint(s, "Fingerprinter{secret hidden}") }

// ensureFingerprintSecret creates namespace ns's fingerprint secret unless it has one (SET NX:
// instances that start together all keep the first one's).
func ensureFingerprintSecret(ctx context.Context, c redis.UniversalClient, ns string) error {
	fresh := make([]byte, fingerprintSecretBytes)
	rand.Read(fresh)
	if err := c.SetNX(ctx, FingerprintKey(ns), fresh, 0).Err(); err != nil {
		return fmt.Errorf("create fingerprint secret: %w", err)
	}
	return nil
}

// OpenFingerprint returns the fingerprinter of namespace ns. A namespace OpenState or NewNamespace
// returned holds its secret (a new one gets it before its epoch); one without it has lost its
// state, and OpenFingerprint returns ErrStateLost rather than make fingerprints that would find
// none of the records. (OpenState refuses a layout-11 namespace without its secret the same way,
// and gives a layout-10 namespace without one a new one: nothing there depends on it.)
func OpenFingerprint(ctx context.Context, c redis.UniversalClient, ns string) (*Fingerprinter, error) {
	secret, err := c.Get(ctx, FingerprintKey(ns)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: namespace %q has no fingerprint secret", ErrStateLost, ns)
	}
	if err != nil {
		return nil, fmt.Errorf("read fingerprint secret: %w", err)
	}
	f, err := newFingerprinter(secret)
	if err != nil {
		return nil, fmt.Errorf("namespace %q: %w", ns, err)
	}
	return f, nil
}
