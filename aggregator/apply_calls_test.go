package aggregator

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestRecordApplyCalls writes every apply-script call of a cost stream (its keys, its arguments
// and the reply real Redis gave) to the file REPEATRATE_APPLY_CALLS names, so that
// testdata/luaprof/replay.lua can run the same calls under a stand-alone Lua 5.1 with a line
// profiler (Redis's Lua has neither os.clock nor the debug library) and check every reply:
//
//	REPEATRATE_APPLY_CALLS=/tmp/calls.bin REPEATRATE_APPLY_CALLS_SHAPE=recent:400:30s:60000 \
//	  go test -count=1 -run TestRecordApplyCalls ./aggregator
//
// The shape is name:aggregates:span:events (costStream's); the batch size is costBatch's.
// REPEATRATE_APPLY_CALLS_LAYOUT=11 records layout 11's calls. The script Redis runs is
// packed_records.lua then apply.lua: replay the two concatenated.
func TestRecordApplyCalls(t *testing.T) {
	path := os.Getenv("REPEATRATE_APPLY_CALLS")
	if path == "" {
		t.Skip("set REPEATRATE_APPLY_CALLS to the file to write")
	}
	spec := strings.Split(os.Getenv("REPEATRATE_APPLY_CALLS_SHAPE")+":::", ":")
	shape, events := costShape{name: "recent", aggregates: 400, span: 30 * time.Second}, 60000
	if spec[0] != "" {
		shape.name = spec[0]
	}
	if n, err := strconv.Atoi(spec[1]); err == nil {
		shape.aggregates = n
	}
	if d, err := time.ParseDuration(spec[2]); err == nil {
		shape.span = d
	}
	if n, err := strconv.Atoi(spec[3]); err == nil {
		events = n
	}
	ctx := context.Background()
	client := costRedis(t)
	prefix := testenv.Name(t, "calls")
	testenv.CleanPrefix(t, client, prefix)
	cfg := RedisConfig{Prefix: prefix, Retention: 30 * 24 * time.Hour, IdleTTL: 30 * 24 * time.Hour}
	if os.Getenv("REPEATRATE_APPLY_CALLS_LAYOUT") == "11" {
		cfg.Fingerprint = testFingerprinter(t)
	}
	if err := applyScript.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	put := func(ss ...string) {
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(ss)))
		w.Write(n[:])
		for _, s := range ss {
			binary.LittleEndian.PutUint32(n[:], uint32(len(s)))
			w.Write(n[:])
			w.WriteString(s)
		}
	}
	const ret = 30 * 24 * time.Hour
	// The calls are made as Redis.Apply makes them: Encode's keys and arguments, the head filled in.
	store, err := NewRedis(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	batches, ats := costStream(shape, events)
	calls := 0
	for b, obs := range batches {
		e := store.Encode(obs)
		if e.err != nil {
			t.Fatal(e.err)
		}
		for _, k := range e.keys {
			iargs := e.args[k]
			copy(iargs, []any{strconv.FormatInt(int64(ret/time.Microsecond), 10), strconv.FormatInt(Micros(ats[b]), 10),
				strconv.FormatInt(ret.Milliseconds(), 10)})
			args := make([]string, len(iargs))
			for i, a := range iargs {
				args[i] = a.(string)
			}
			redisKeys := e.redis[k]
			reply, err := applyScript.EvalSha(ctx, client, redisKeys, iargs...).Slice()
			if err != nil {
				t.Fatal(err)
			}
			parts := make([]string, len(reply))
			for i, v := range reply {
				parts[i] = fmt.Sprint(v)
			}
			put(redisKeys...)
			put(args...)
			put(strings.Join(parts, "|"))
			calls++
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls of %d batches (%d events, %s) written to %s", calls, len(batches), events, shape.name, path)
}
