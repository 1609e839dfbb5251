// Package bench holds the node proxy's benchmarks that need the real Envoy and real network
// namespaces (root): Envoy memory and the cost of adding one pod at 1k and 10k clusters for both
// client-certificate selection mechanisms, and the latency the mesh path adds over a direct
// connection. Run them with:
//
//	go test ./bench/ -run '^$' -bench . -benchtime 1x -timeout 30m
//
// The snapshot-build benchmark lives beside the builders (xds.BenchmarkSnapshotBuild).
package bench
