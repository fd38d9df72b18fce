// Package testpb is the generated code of test.proto, the service of
// rpcguard's tests. Regenerate it with go generate (needs protoc and the
// plugins at the versions named in the generated files' headers):
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//	go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
package testpb

//go:generate protoc -I ../../.. --go_out=../../.. --go_opt=paths=source_relative --go-grpc_out=../../.. --go-grpc_opt=paths=source_relative --connect-go_out=../../.. --connect-go_opt=paths=source_relative rpcguard/internal/testpb/test.proto
