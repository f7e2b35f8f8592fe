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
	batches, ats := costStream(shape, events)
	calls := 0
	for b, obs := range batches {
		groups, keys := groupByKey(obs)
		recs := encodeRecords(obs)
		fields, err := recordFields(obs)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			args := []string{strconv.FormatInt(int64(ret/time.Microsecond), 10), strconv.FormatInt(Micros(ats[b]), 10),
				strconv.FormatInt(ret.Milliseconds(), 10)}
			for _, i := range groups[k] {
				args = append(args, fields[i])
			}
			for _, i := range groups[k] {
				args = append(args, recs[i])
			}
			base := prefix + ":{" + k.String() + "}:"
			redisKeys := []string{base + "o", base + "s", base + "e", base + "z"}
			iargs := make([]any, len(args))
			for i, a := range args {
				iargs[i] = a
			}
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
