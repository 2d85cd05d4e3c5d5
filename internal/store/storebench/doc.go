// Package storebench measures orch's store against an embedded single-node
// etcd with the same durability, in the same run, so the numbers compare
// like with like on a noisy machine. Only its tests import etcd: the orch
// binary never links it. Run it with `make bench`.
package storebench
