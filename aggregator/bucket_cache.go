package aggregator

import "sync/atomic"

// DefaultBucketCacheBytes bounds bucketCache unless RedisConfig.BucketCacheBytes says otherwise:
// past it the buckets of arbitrary other aggregates are forgotten, whole, until the cache fits
// again. 64 MiB holds about 1.8 million records' buckets (31-byte records in buckets of about
// packLoad, each costing cachedBucketOverhead besides: about 37 bytes a record).
const DefaultBucketCacheBytes = 64 << 20

// cachedBucketOverhead is what a cached bucket costs besides its records (its map entry, number
// and string header), and cachedStoreOverhead what an aggregate's entry costs besides its
// buckets, roughly.
const (
	cachedBucketOverhead = 48
	cachedStoreOverhead  = 160
)

// bucketCache holds, per aggregate of layout 11, buckets of its packed store as they stood under
// one token and write stamp (bucketsToken, bucketsWritten) that a computed call of this processor
// wrote together: those its stored calls read or wrote since. Every script that writes a bucket
// makes a new stamp, and a write Redis lost takes its token with it, so while Redis holds that
// token and stamp the buckets are as that call and the calls after it left them, and a call reads
// the two alone in their place (computeCalls). A call that finds others (another writer,
// apply.lua, a write Redis lost) reads its buckets again. Guarded by sealMu.
type bucketCache struct {
	stores map[Key]*cachedStore
	bytes  int64 // what the stores hold (cachedStore.bytes)
	max    int64 // RedisConfig.BucketCacheBytes, as validated (NewRedis)
	// held is bytes as each call left it (never past max), and evicted counts the aggregates
	// whose buckets were forgotten to make room, for reading without sealMu (Redis.BucketCache).
	held, evicted atomic.Int64
}

// cachedStore is one aggregate's cached buckets, by number ("" for a bucket absent), as they
// stood under stamp and token.
type cachedStore struct {
	stamp   string
	token   string
	buckets map[int64]string
	bytes   int64
}

// at returns aggregate k's cached buckets, or nil.
func (c *bucketCache) at(k Key) *cachedStore {
	return c.stores[k]
}

// drop forgets aggregate k's buckets.
func (c *bucketCache) drop(k Key) {
	c.forget(k)
	c.held.Store(c.bytes)
}

// forget forgets aggregate k's buckets, leaving held as it was.
func (c *bucketCache) forget(k Key) {
	if s, ok := c.stores[k]; ok {
		c.bytes -= s.bytes
		delete(c.stores, k)
	}
}

// evict forgets aggregate k's buckets to make room, and counts it.
func (c *bucketCache) evict(k Key) {
	if _, ok := c.stores[k]; ok {
		c.forget(k)
		c.evicted.Add(1)
	}
}

// keep records that a call stored in aggregate k left buckets as they stand under stamp and
// token: the call read them under readStamp and readToken (which store.lua checked) and left them
// as bs say (read, or changed). The aggregate's other cached buckets, cached under what the call
// read, stand under the new stamp and token too: store.lua wrote nothing else in between. Cached
// under others, they are forgotten.
func (c *bucketCache) keep(k Key, readStamp, readToken, stamp, token string, bs []storeBucket) {
	s := c.stores[k]
	if s == nil || s.stamp != readStamp || s.token != readToken {
		c.forget(k)
		s = &cachedStore{buckets: make(map[int64]string, len(bs)), bytes: cachedStoreOverhead}
		if c.stores == nil {
			c.stores = make(map[Key]*cachedStore)
		}
		c.stores[k] = s
		c.bytes += cachedStoreOverhead
	}
	s.stamp, s.token = stamp, token
	for _, bk := range bs {
		v := bk.read
		if bk.changed {
			v = string(bk.now)
		}
		old, had := s.buckets[bk.b]
		if had {
			s.bytes -= int64(len(old)) + cachedBucketOverhead
			c.bytes -= int64(len(old)) + cachedBucketOverhead
		}
		s.buckets[bk.b] = v
		s.bytes += int64(len(v)) + cachedBucketOverhead
		c.bytes += int64(len(v)) + cachedBucketOverhead
	}
	if s.bytes > c.max {
		c.evict(k) // one aggregate's buckets alone past the bound: the others stay
	}
	for other := range c.stores { // a map's iteration starts at a random entry
		if c.bytes <= c.max {
			break
		}
		if other != k {
			c.evict(other)
		}
	}
	c.held.Store(c.bytes)
}

// uncached returns the fields of the buckets of store that s does not hold, in the store's order.
func (s *cachedStore) uncached(store *bucketStore) []any {
	var names []any
	for _, bk := range store.buckets {
		if _, ok := s.buckets[bk.b]; !ok {
			names = append(names, bucketName(bk.b))
		}
	}
	return names
}

// reply returns what reading every bucket of store and then the token and stamp would have
// returned (bucketsRead), from read, the buckets s does not hold as read in the store's order
// (uncached), and the token and stamp read after them, or false when read is not those buckets.
func (s *cachedStore) reply(store *bucketStore, read []any, token, stamp any) ([]any, bool) {
	out := make([]any, 0, len(store.buckets)+2)
	next := 0
	for _, bk := range store.buckets {
		if v, ok := s.buckets[bk.b]; ok {
			if v == "" {
				out = append(out, nil)
			} else {
				out = append(out, v)
			}
			continue
		}
		if next >= len(read) {
			return nil, false
		}
		out = append(out, read[next])
		next++
	}
	if next != len(read) {
		return nil, false
	}
	return append(out, token, stamp), true
}
