package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.util.Random;

import net.jpountz.lz4.LZ4FrameOutputStream;
import org.junit.jupiter.api.Test;

/**
 * The producer compresses every frame into its connection's one buffer:
 * LZ4 frames written directly (the bytes lz4-java's LZ4FrameOutputStream
 * writes, without its 4 MiB block buffers per frame) and zstd into the
 * same kind of buffer. Both must decode, and the buffer must not keep old
 * bytes between frames.
 */
class CompressTest {
    static byte[][] inputs() {
        Random r = new Random(42);
        byte[] random = new byte[70_000];
        r.nextBytes(random);
        byte[] text = new byte[(5 << 20) + 12345]; // more than one 4 MiB block
        for (int i = 0; i < text.length; i++) {
            String line = "log line " + (i / 97) % 1000 + "\n";
            text[i] = (byte) line.charAt(i % line.length());
        }
        byte[] mixed = new byte[(4 << 20) + 1];
        r.nextBytes(mixed);
        System.arraycopy(text, 0, mixed, 0, 1 << 20);
        return new byte[][] {{7}, "hello hello hello hello".getBytes(), random, text, mixed, new byte[4 << 20]};
    }

    @Test
    void lz4FramesAreLz4JavasBytes() throws Exception {
        Protocol.Buf out = new Protocol.Buf(16);
        for (byte[] in : inputs()) {
            ByteArrayOutputStream want = new ByteArrayOutputStream();
            try (LZ4FrameOutputStream w = new LZ4FrameOutputStream(want)) {
                w.write(in, 0, in.length);
            }
            Protocol.compress(in, 0, in.length, Protocol.COMPRESS_LZ4, out);
            assertArrayEquals(want.toByteArray(), out.toArray(), in.length + " bytes");
            assertArrayEquals(in, Protocol.decompress(out.toArray(), Protocol.COMPRESS_LZ4, 16 << 20), in.length + " bytes back");
        }
    }

    @Test
    void zstdIntoAReusedBuffer() throws Exception {
        Protocol.Buf out = new Protocol.Buf(16);
        for (byte[] in : inputs()) {
            Protocol.compress(in, 0, in.length, Protocol.COMPRESS_ZSTD, out);
            assertArrayEquals(in, Protocol.decompress(out.toArray(), Protocol.COMPRESS_ZSTD, 16 << 20), in.length + " bytes back");
        }
        // An offset into a larger buffer, as the producer compresses after a frame's prefix room.
        byte[] in = inputs()[3];
        Protocol.compress(in, 100, 5000, Protocol.COMPRESS_ZSTD, out);
        assertArrayEquals(java.util.Arrays.copyOfRange(in, 100, 5100), Protocol.decompress(out.toArray(), Protocol.COMPRESS_ZSTD, 1 << 20));
        Protocol.compress(in, 100, 5000, Protocol.COMPRESS_LZ4, out);
        assertArrayEquals(java.util.Arrays.copyOfRange(in, 100, 5100), Protocol.decompress(out.toArray(), Protocol.COMPRESS_LZ4, 1 << 20));
    }

    @Test
    void aFrameBufferStopsDoublingAtItsSoftCap() {
        assertEquals(100, Protocol.Buf.grown(100, 50, 1000), "fits: unchanged");
        assertEquals(200, Protocol.Buf.grown(100, 150, 1000), "doubles");
        assertEquals(1000, Protocol.Buf.grown(600, 700, 1000), "not past the cap");
        assertEquals(1500, Protocol.Buf.grown(1000, 1500, 1000), "past it only as far as one write needs");
        assertEquals(400, Protocol.Buf.grown(100, 400, 1000), "a write larger than double");
        assertTrue(Protocol.Buf.grown(Integer.MAX_VALUE / 2 + 10, Integer.MAX_VALUE / 2 + 20, Integer.MAX_VALUE) > 0, "no overflow");
    }
}
