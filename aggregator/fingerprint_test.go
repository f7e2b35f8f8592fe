package aggregator

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestFingerprintIsTruncatedHMACSHA256 holds the fingerprint to HMAC-SHA-256 as another
// implementation computes it (Python's hmac module, the vectors below), so that the migration's
// Go and any other tool agree on every id, whatever bytes it holds.
func TestFingerprintIsTruncatedHMACSHA256(t *testing.T) {
	secret := make([]byte, fingerprintSecretBytes)
	for i := range secret {
		secret[i] = byte(i)
	}
	f, err := newFingerprinter(secret)
	if err != nil {
		t.Fatal(err)
	}
	// python3 -c "import hmac,hashlib; print(hmac.new(bytes(range(32)), ID, hashlib.sha256).hexdigest()[:32])"
	for id, want := range map[string]string{
		"conv-0000123/turn-1":     "c4134268fddaf869c295fb3584406cea",
		"":                        "d38b42096d80f45f826b44a9d5607de7",
		"é/日本\x00\xff":            "fd1a3c6aba0cb78811989dd0722dad76",
		strings.Repeat("x", 5000): "a80540efa87ec65bec9c11f75e955418", // past what the pool keeps
	} {
		got := f.Append([]byte("kept"), id)
		if string(got[:4]) != "kept" || hex.EncodeToString(got[4:]) != want {
			t.Errorf("fingerprint of %q: %x, want kept then %s", id, got, want)
		}
	}
	for _, n := range []int{0, 16, 31, 33} {
		if _, err := newFingerprinter(make([]byte, n)); err == nil {
			t.Errorf("a secret of %d bytes was accepted", n)
		}
	}
}

// TestFingerprintAllocatesNothing: a fingerprint appended where there is room allocates nothing,
// as it is made for every opportunity of every batch.
func TestFingerprintAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not checked under the race detector")
	}
	f, err := newFingerprinter(bytes.Repeat([]byte{7}, fingerprintSecretBytes))
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 0, FingerprintBytes)
	id := "conv-0000123/turn-1"
	if n := testing.AllocsPerRun(1000, func() { dst = f.Append(dst[:0], id) }); n != 0 {
		t.Errorf("a fingerprint allocated %v times", n)
	}
}

// TestFingerprintsAgreeAcrossGoroutines: the fingerprinter's pooled MACs are reset before every
// use, so fingerprints made concurrently equal those made one at a time.
func TestFingerprintsAgreeAcrossGoroutines(t *testing.T) {
	f, err := newFingerprinter(bytes.Repeat([]byte{7}, fingerprintSecretBytes))
	if err != nil {
		t.Fatal(err)
	}
	want := make([][]byte, 2000)
	for i := range want {
		want[i] = f.Append(nil, fmt.Sprintf("id-%d", i))
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range want {
				j := (i + g*251) % len(want)
				if got := f.Append(nil, fmt.Sprintf("id-%d", j)); !bytes.Equal(got, want[j]) {
					errs <- fmt.Sprintf("goroutine %d, id-%d: %x, want %x", g, j, got, want[j])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestFingerprinterPrintsNoSecret: a fingerprinter logged or printed by mistake shows neither its
// secret nor the MAC state derived from it.
func TestFingerprinterPrintsNoSecret(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789ABCDEF")
	f, err := newFingerprinter(secret)
	if err != nil {
		t.Fatal(err)
	}
	f.Append(nil, "warm the pool")
	js, err := json.Marshal(struct{ F *Fingerprinter }{f})
	if err != nil {
		t.Fatal(err)
	}
	outs := []string{string(js)}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X"} {
		outs = append(outs, fmt.Sprintf(verb, f), fmt.Sprintf(verb, struct{ F *Fingerprinter }{f}))
	}
	for _, out := range outs {
		for _, leak := range []string{string(secret), hex.EncodeToString(secret), "ipad", "opad", "0123"} {
			if strings.Contains(strings.ToLower(out), strings.ToLower(leak)) {
				t.Errorf("printed %q, which shows %q", out, leak)
			}
		}
	}
}

// TestFingerprintSecretAdoptedByEveryInstance: instances that open one namespace at once, and any
// that opens it later, fingerprint every id alike (the first secret written wins); a namespace
// that lost its secret is refused as lost state, not given fingerprints that find nothing.
func TestFingerprintSecretAdoptedByEveryInstance(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Name(t, "fingerprint")
	testenv.CleanPrefix(t, client, prefix)

	const instances = 8
	sums := make([][]byte, instances)
	errs := make([]error, instances)
	var wg sync.WaitGroup
	for i := 0; i < instances; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := OpenState(ctx, client, prefix, false)
			if err != nil {
				errs[i] = err
				return
			}
			f, err := OpenFingerprint(ctx, client, st.Namespace)
			if err != nil {
				errs[i] = err
				return
			}
			sums[i] = f.Append(nil, "conv-1/turn-1")
		}()
	}
	wg.Wait()
	for i := range sums {
		if errs[i] != nil {
			t.Fatalf("instance %d: %v", i, errs[i])
		}
		if !bytes.Equal(sums[i], sums[0]) {
			t.Fatalf("instance %d fingerprints conv-1/turn-1 as %x, instance 0 as %x", i, sums[i], sums[0])
		}
	}
	if ttl := client.PTTL(ctx, FingerprintKey(prefix)).Val(); ttl >= 0 {
		t.Errorf("the secret expires in %v: it must live as long as the namespace's epoch", ttl)
	}

	// A later start, on the namespace it now holds.
	st, err := OpenState(ctx, client, prefix, true)
	if err != nil {
		t.Fatal(err)
	}
	f, err := OpenFingerprint(ctx, client, st.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Append(nil, "conv-1/turn-1"); !bytes.Equal(got, sums[0]) {
		t.Fatalf("reopened: %x, want %x", got, sums[0])
	}

	// A rebuild's namespace has a secret of its own.
	fresh, err := NewNamespace(ctx, client, prefix)
	if err != nil {
		t.Fatal(err)
	}
	g, err := OpenFingerprint(ctx, client, fresh.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Append(nil, "conv-1/turn-1"); bytes.Equal(got, sums[0]) {
		t.Fatal("a rebuild's namespace fingerprints like the one it replaces: its secret was copied, not made")
	}

	client.Del(ctx, FingerprintKey(prefix))
	if _, err := OpenFingerprint(ctx, client, prefix); !errors.Is(err, ErrStateLost) {
		t.Fatalf("a namespace without its secret: %v, want ErrStateLost", err)
	}
}

// BenchmarkFingerprint is what fingerprinting an opportunity id costs the processor per event
// (225 ns on the bench machine, against 12–14 µs of processor CPU per event in make bench).
func BenchmarkFingerprint(b *testing.B) {
	f, err := newFingerprinter(bytes.Repeat([]byte{7}, fingerprintSecretBytes))
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, FingerprintBytes)
	b.ReportAllocs()
	for b.Loop() {
		buf = f.Append(buf[:0], "conv-0000123/turn-1")
	}
}
