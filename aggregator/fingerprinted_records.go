package aggregator

import (
	_ "embed"
)

// State layout 11, beside layout 10: apply.lua keeps it for calls whose records are fingerprints
// and binary records (encodeFingerprinted), in the packed record store (packed_records.lua,
// prepended to apply.lua). A store makes such calls when its configuration carries a
// fingerprinter, which it must exactly when its namespace was created in layout 11 (State.Layout).

//go:embed packed_records.lua
var packedRecordsSource string

// encodeFingerprinted returns each observation's fingerprint and its layout-11 record (record.go),
// each a slice of one string per kind, or why an observation cannot be stored.
func encodeFingerprinted(f *Fingerprinter, obs []Observation) (fps, recs []string, err error) {
	fbuf := make([]byte, 0, len(obs)*FingerprintBytes)
	rbuf := make([]byte, 0, len(obs)*(1+3*recordTimeBytes))
	ends := make([]int, len(obs))
	for i := range obs {
		fbuf = f.Append(fbuf, obs[i].OpportunityID)
		if rbuf, err = appendRecord(rbuf, &obs[i]); err != nil {
			return nil, nil, err
		}
		ends[i] = len(rbuf)
	}
	fs, rs := string(fbuf), string(rbuf)
	fps, recs = make([]string, len(obs)), make([]string, len(obs))
	from := 0
	for i := range obs {
		fps[i] = fs[i*FingerprintBytes : (i+1)*FingerprintBytes]
		recs[i] = rs[from:ends[i]]
		from = ends[i]
	}
	return fps, recs, nil
}
