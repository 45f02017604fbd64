package broker

import "sync"

// forEachPartition runs f once for each partition's share of a request and returns when
// every call has. Partitions have their own logs and their own fsyncs, so the shares run
// in parallel; a single share runs on the caller's goroutine, which spares a goroutine
// on the common path of a request that touches one partition. f must guard whatever it
// writes that the other calls also write.
func forEachPartition[P comparable, S any](shares map[P]S, f func(p P, share S)) {
	if len(shares) == 1 {
		for p, s := range shares {
			f(p, s)
		}
		return
	}
	var wg sync.WaitGroup
	for p, s := range shares {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(p, s)
		}()
	}
	wg.Wait()
}
