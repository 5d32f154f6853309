package dev.ferry.producer;

import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A TCP proxy in front of the real agent's local protocol port that loses
 * answers the way a network does: it forwards both directions frame by
 * frame, and drops the agent's cutEvery-th result frame (counting from the
 * first: results 1, 1 + cutEvery, ...) up to maxCuts times, closing both
 * connections instead of forwarding it. The agent has then stored the frame
 * (in spool mode a result means the records are on disk) and the producer
 * never hears it: it must send the frame again. It also records what the
 * handshakes asked for and were granted, and how many produce frames carried
 * a sequence (flag 16).
 */
final class CutProxy implements AutoCloseable {
    private final ServerSocket ss = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
    private final int target;
    private final int cutEvery, maxCuts;
    private final AtomicInteger results = new AtomicInteger();
    final AtomicInteger cuts = new AtomicInteger(), produces = new AtomicInteger(), sequenced = new AtomicInteger();
    /** Each connection's preamble version, and the features its hello_ok granted. */
    final List<Integer> preambles = Collections.synchronizedList(new ArrayList<>());
    final List<Long> granted = Collections.synchronizedList(new ArrayList<>());
    private final List<Socket> open = Collections.synchronizedList(new ArrayList<>());

    CutProxy(int target, int cutEvery, int maxCuts) throws IOException {
        this.target = target;
        this.cutEvery = cutEvery;
        this.maxCuts = maxCuts;
        Thread t = new Thread(this::accept, "cut-proxy");
        t.setDaemon(true);
        t.start();
    }

    String address() {
        return "tcp:127.0.0.1:" + ss.getLocalPort();
    }

    private void accept() {
        while (true) {
            Socket c;
            try {
                c = ss.accept();
            } catch (IOException e) {
                return; // closed
            }
            Thread t = new Thread(() -> serve(c), "cut-proxy-conn");
            t.setDaemon(true);
            t.start();
        }
    }

    private void serve(Socket c) {
        Socket a;
        try {
            a = new Socket(InetAddress.getLoopbackAddress(), target);
        } catch (IOException e) {
            close(c);
            return;
        }
        open.add(c);
        open.add(a);
        Thread up = new Thread(() -> {
            try {
                DataInputStream in = new DataInputStream(c.getInputStream());
                OutputStream out = a.getOutputStream();
                byte[] pre = new byte[4];
                in.readFully(pre);
                preambles.add((int) pre[3]);
                out.write(pre);
                while (true) {
                    byte[][] f = frame(in);
                    int type = f[0][4], flags = f[0][5] & 0xFF;
                    if (type == Protocol.PRODUCE) {
                        produces.incrementAndGet();
                        if ((flags & Protocol.FLAG_SEQUENCE) != 0) {
                            sequenced.incrementAndGet();
                        }
                    }
                    out.write(f[0]);
                    out.write(f[1]);
                }
            } catch (IOException e) {
                // either side closed
            } finally {
                close(a);
                close(c);
            }
        }, "cut-proxy-up");
        up.setDaemon(true);
        up.start();
        try {
            DataInputStream in = new DataInputStream(a.getInputStream());
            OutputStream out = c.getOutputStream();
            while (true) {
                byte[][] f = frame(in);
                int type = f[0][4];
                if (type == Protocol.HELLO_OK) {
                    granted.add(Protocol.decodeHelloOk(f[1]).features);
                } else if (type == Protocol.RESULT && (results.getAndIncrement() % cutEvery) == 0 && cuts.get() < maxCuts) {
                    cuts.incrementAndGet();
                    return; // dropped: both connections close below
                }
                out.write(f[0]);
                out.write(f[1]);
                out.flush();
            }
        } catch (IOException e) {
            // either side closed
        } finally {
            close(a);
            close(c);
        }
    }

    /** A frame's header and body. */
    private static byte[][] frame(DataInputStream in) throws IOException {
        byte[] h = new byte[10];
        in.readFully(h);
        Protocol.Header fh = Protocol.parseHeader(h, 64 << 20);
        byte[] body = new byte[fh.bodyLen()];
        in.readFully(body);
        return new byte[][] {h, body};
    }

    private static void close(Socket s) {
        try {
            s.close();
        } catch (IOException e) {
            // already closed
        }
    }

    @Override
    public void close() throws IOException {
        ss.close();
        synchronized (open) {
            for (Socket s : open) {
                close(s);
            }
        }
    }
}
