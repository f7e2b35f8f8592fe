package schemas

import "embed"

// Files holds the JSON Schema of each event's data, named <type-suffix>.v1.schema.json. They are
// published for producers and subscribers; a test keeps them equal to the Go types.
//
//go:embed *.schema.json
var Files embed.FS
