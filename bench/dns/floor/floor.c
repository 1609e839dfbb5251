/*
 * floor: the cheapest UDP responder, for bench/dns/run.sh's "floor" row. It answers every
 * datagram with itself, the QR bit set (RFC 1035 section 4.1.1), so dnsperf counts it as a
 * response: no parsing, no lookup, no allocation, one blocking recvfrom(2) and one sendto(2) per
 * query on one thread. Its latency at a low rate is what the kernel, the loopback path and the
 * idle CPU's wake-up cost on this machine; no user-space resolver answers faster.
 *
 *   floor ADDR PORT
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: floor ADDR PORT\n");
		return 2;
	}
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	if (fd < 0 || inet_pton(AF_INET, argv[1], &a.sin_addr) != 1 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
		perror("floor: listen");
		return 1;
	}
	unsigned char buf[4096];
	for (;;) {
		struct sockaddr_in from;
		socklen_t len = sizeof from;
		ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &len);
		if (n < 12)
			continue;
		buf[2] |= 0x80;
		sendto(fd, buf, n, 0, (struct sockaddr *)&from, len);
	}
}
