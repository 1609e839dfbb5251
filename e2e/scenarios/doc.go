// Package scenarios is aether's end-to-end scenario suite (TestScenarios), written against a small
// ClusterPair interface so the same tests run on the local two-cluster substrate (-pair=local, the
// default: e2e/mesh) and on two real kind clusters (-pair=kind with -kubeconfig-a and
// -kubeconfig-b, run by e2e/kind). See docs/e2e.md.
//
// It drives aether only from the outside (Kubernetes objects, traffic from pods, and the pair's
// disruptions); it never imports aether's internal packages.
package scenarios
