package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.StandardProtocolFamily;
import java.net.StandardSocketOptions;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.condition.EnabledOnOs;
import org.junit.jupiter.api.condition.OS;

/**
 * A Unix connection asks for a send buffer of UNIX_SEND_BUFFER, so a whole
 * frame fits in the socket while the agent is busy (as far as
 * net.core.wmem_max lets it).
 */
@EnabledOnOs(OS.LINUX)
class UnixSendBufferTest {
    @Test
    void unixConnectionsHoldFrames() throws Exception {
        Path dir = Files.createTempDirectory("usb");
        Path sock = dir.resolve("s");
        try (ServerSocketChannel srv = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
            srv.bind(UnixDomainSocketAddress.of(sock));
            try (SocketChannel plain = SocketChannel.open(StandardProtocolFamily.UNIX);
                 SocketChannel tuned = SocketChannel.open(StandardProtocolFamily.UNIX)) {
                Producer.tuneUnix(tuned);
                plain.connect(UnixDomainSocketAddress.of(sock));
                tuned.connect(UnixDomainSocketAddress.of(sock));
                int want = Producer.UNIX_SEND_BUFFER;
                Path max = Path.of("/proc/sys/net/core/wmem_max");
                if (Files.exists(max)) {
                    // readAllLines: readString trusts procfs's size of 0 and can return a partial read.
                    want = Math.min(want, Integer.parseInt(Files.readAllLines(max).get(0).trim()));
                }
                int before = plain.getOption(StandardSocketOptions.SO_SNDBUF);
                int after = tuned.getOption(StandardSocketOptions.SO_SNDBUF);
                // The JDK reports what was asked for (Linux's doubled value, halved).
                assertTrue(after >= want && after >= before,
                        "send buffer " + after + " bytes (a plain channel: " + before + "), want at least " + want);
            }
        } finally {
            Files.deleteIfExists(sock);
            Files.deleteIfExists(dir);
        }
    }
}
