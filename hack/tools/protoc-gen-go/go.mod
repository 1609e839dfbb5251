module github.com/aethermesh/aether/hack/tools/protoc-gen-go

go 1.26.8

require google.golang.org/protobuf v1.36.12 // indirect

tool google.golang.org/protobuf/cmd/protoc-gen-go
