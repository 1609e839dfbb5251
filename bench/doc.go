// Package bench holds the node proxy's benchmarks that need the real Envoy and real network
// namespaces (root): Envoy memory and the cost of adding one pod at 1k and 10k clusters for both
// client-certificate selection mechanisms. Run them with:
//
//	go test ./bench/ -run '^$' -bench . -benchtime 1x -timeout 30m
//
// The snapshot-build benchmark lives beside the builders (xds.BenchmarkSnapshotBuild), and so do
// the added-latency benchmarks (xds.BenchmarkMeshLatency, xds.BenchmarkWaypoint), run by the
// scripts bench/latency.sh and bench/waypoint.sh (docs/latency-benchmarks.md). bench/gamma.sh
// runs the GAMMA routing benchmarks (xds.BenchmarkGAMMARouteLatency,
// xds.BenchmarkSnapshotBuildRoutes, agent.BenchmarkRouteApplyToTraffic) and compares their
// repetitions with benchstat (docs/routing.md, "Performance").
package bench
