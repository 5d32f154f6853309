package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.charset.StandardCharsets;
import java.util.Random;

import org.junit.jupiter.api.Test;

class LogItemTest {
    @Test
    void jsonKeepsOrderEscapesAndUtf8() {
        LogItem it = new LogItem().pushBack("z", "last? no, first").pushBack("a", "quote \" back\\slash\nnew\u0001").pushBack("中", "测试日志");
        String json = new String(it.toJson(), StandardCharsets.UTF_8);
        assertEquals("{\"z\":\"last? no, first\",\"a\":\"quote \\\" back\\\\slash\\nnew\\u0001\",\"中\":\"测试日志\"}", json);
    }

    @Test
    void sizeIsCountedInUtf8Bytes() {
        byte[] b = new LogItem().pushBack("k", "测").toJson();
        assertEquals("{\"k\":\"\"}".length() + 3, b.length);
    }

    @Test
    void surrogatesEncodeAsStringGetBytesDoes() {
        // A pair is one 4-byte character; a lone half cannot be encoded and becomes '?'.
        String pair = "a\uD83D\uDE00b", lone = "x\uD83Dy\uDE00";
        assertEquals("{\"k\":\"" + pair + "\",\"l\":\"x?y?\"}", new String(new LogItem().pushBack("k", pair).pushBack("l", lone).toJson(), StandardCharsets.UTF_8));
    }

    /** The one-pass encoder against the obvious one (escape, then String.getBytes) on random text of every kind of character. */
    @Test
    void matchesTheObviousEncoderOnRandomText() {
        Random r = new Random(42);
        char[] kinds = {'a', '"', '\\', '\n', '\u0001', '\u00e9', '\u6d4b', '\uD83D', '\uDE00', '\u007f', '\u07ff', '\u0800', '\uffff'};
        for (int round = 0; round < 2000; round++) {
            LogItem it = new LogItem();
            StringBuilder want = new StringBuilder("{");
            int fields = r.nextInt(5);
            for (int f = 0; f < fields; f++) {
                String k = random(r, kinds, r.nextInt(8)), v = random(r, kinds, r.nextInt(round < 1990 ? 200 : 300_000));
                it.pushBack(k, v);
                want.append(f > 0 ? "," : "").append('"').append(escape(k)).append("\":\"").append(escape(v)).append('"');
            }
            want.append('}');
            assertArrayEquals(want.toString().getBytes(StandardCharsets.UTF_8), it.toJson(), "round " + round);
        }
    }

    private static String random(Random r, char[] kinds, int n) {
        StringBuilder sb = new StringBuilder(n);
        for (int i = 0; i < n; i++) {
            sb.append(r.nextInt(3) == 0 ? kinds[r.nextInt(kinds.length)] : (char) ('a' + r.nextInt(26)));
        }
        return sb.toString();
    }

    private static String escape(String s) {
        StringBuilder sb = new StringBuilder();
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default: sb.append(c < 0x20 ? String.format("\\u%04x", (int) c) : String.valueOf(c));
            }
        }
        return sb.toString();
    }
}
