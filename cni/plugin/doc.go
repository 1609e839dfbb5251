// Package plugin is the aether-cni binary's logic (CNI spec 1.1: ADD, DEL, CHECK, GC, STATUS,
// VERSION) and the wire protocol it speaks with the agent over the agent's unix socket.
//
// It must stay small: the plugin runs once per pod start inside the kubelet's CNI chain, so it
// imports neither package model nor client-go (their package init costs milliseconds per exec).
// It never changes the prevResult it passes through and writes nothing but the CNI result to
// stdout. The agent side (server, store, installer) is package cni.
package plugin
