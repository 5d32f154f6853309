package dev.ferry.producer;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * A log as ordered key-value contents, serialised as one JSON object
 * ({"k1":"v1","k2":"v2"}, in the order the contents were added).
 */
public final class LogItem {
    private final List<String[]> contents = new ArrayList<>();

    /** Scratch space per sending thread: a log is escaped and encoded in one pass, then copied once to its exact size. */
    private static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

    /** Logs larger than this (worst case) are encoded into a buffer of their own instead of the thread's scratch. */
    private static final int MAX_SCRATCH = 1 << 20;

    public LogItem pushBack(String key, String value) {
        contents.add(new String[] {key, value});
        return this;
    }

    public List<String[]> getContents() { return contents; }

    /** The JSON object, UTF-8, in one exact-size array. */
    public byte[] toJson() {
        int n = contents.size();
        int chars = 0;
        for (int i = 0; i < n; i++) {
            String[] kv = contents.get(i);
            chars = Math.max(chars, Math.max(kv[0].length(), kv[1].length()));
        }
        long worst = 2;
        for (int i = 0; i < n; i++) {
            String[] kv = contents.get(i);
            worst += 6L * (kv[0].length() + kv[1].length()) + 6; // a six-byte escape is the longest a char gets; 4 quotes, a colon, a comma
        }
        if (worst > Integer.MAX_VALUE - 16) {
            throw new IllegalArgumentException("log of " + worst + " bytes (worst case) is too large to encode");
        }
        Scratch s = worst <= MAX_SCRATCH ? SCRATCH.get() : new Scratch();
        byte[] b = s.bytes((int) worst);
        char[] cs = s.chars(chars);
        int o = 0;
        b[o++] = '{';
        for (int i = 0; i < n; i++) {
            String[] kv = contents.get(i);
            if (i > 0) {
                b[o++] = ',';
            }
            o = string(kv[0], cs, b, o);
            b[o++] = ':';
            o = string(kv[1], cs, b, o);
        }
        b[o++] = '}';
        return Arrays.copyOf(b, o);
    }

    /**
     * Writes s as a quoted JSON string in UTF-8 at b[o], returning the new
     * end. Escapes what JSON requires; an unpaired surrogate becomes '?', as
     * String.getBytes(UTF_8) does.
     */
    private static int string(String s, char[] cs, byte[] b, int o) {
        int n = s.length();
        s.getChars(0, n, cs, 0);
        b[o++] = '"';
        for (int i = 0; i < n; i++) {
            char c = cs[i];
            if (c < 0x80) {
                if (c >= 0x20 && c != '"' && c != '\\') {
                    b[o++] = (byte) c;
                } else {
                    o = escape(c, b, o);
                }
            } else if (c < 0x800) {
                b[o++] = (byte) (0xC0 | (c >> 6));
                b[o++] = (byte) (0x80 | (c & 0x3F));
            } else if (!Character.isSurrogate(c)) {
                b[o++] = (byte) (0xE0 | (c >> 12));
                b[o++] = (byte) (0x80 | ((c >> 6) & 0x3F));
                b[o++] = (byte) (0x80 | (c & 0x3F));
            } else if (Character.isHighSurrogate(c) && i + 1 < n && Character.isLowSurrogate(cs[i + 1])) {
                int cp = Character.toCodePoint(c, cs[++i]);
                b[o++] = (byte) (0xF0 | (cp >> 18));
                b[o++] = (byte) (0x80 | ((cp >> 12) & 0x3F));
                b[o++] = (byte) (0x80 | ((cp >> 6) & 0x3F));
                b[o++] = (byte) (0x80 | (cp & 0x3F));
            } else {
                b[o++] = '?';
            }
        }
        b[o++] = '"';
        return o;
    }

    private static final byte[] HEX = "0123456789abcdef".getBytes(java.nio.charset.StandardCharsets.US_ASCII);

    private static int escape(char c, byte[] b, int o) {
        b[o++] = '\\';
        switch (c) {
            case '"': b[o++] = '"'; break;
            case '\\': b[o++] = '\\'; break;
            case '\n': b[o++] = 'n'; break;
            case '\r': b[o++] = 'r'; break;
            case '\t': b[o++] = 't'; break;
            default:
                b[o++] = 'u';
                b[o++] = '0';
                b[o++] = '0';
                b[o++] = HEX[c >> 4];
                b[o++] = HEX[c & 0xF];
        }
        return o;
    }

    private static final class Scratch {
        private byte[] b = new byte[4096];
        private char[] c = new char[1024];

        byte[] bytes(int n) {
            if (b.length < n) {
                b = new byte[Math.max(n, b.length * 2)];
            }
            return b;
        }

        char[] chars(int n) {
            if (c.length < n) {
                c = new char[Math.max(n, c.length * 2)];
            }
            return c;
        }
    }
}
