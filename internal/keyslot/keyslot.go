// Package keyslot computes where Redis Cluster keeps a key: its hash tag
// and its slot.
package keyslot

import "strings"

// HashTag reports the hash tag Redis Cluster would use for s, or "" if s has
// none: the text between the first '{' and the first '}' after it, when that
// text is not empty.
func HashTag(s string) string {
	open := strings.IndexByte(s, '{')
	if open < 0 {
		return ""
	}
	end := strings.IndexByte(s[open+1:], '}')
	if end <= 0 {
		return ""
	}
	return s[open+1 : open+1+end]
}

// Of returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag, or of the whole key when it has none, modulo 16384.
func Of(key string) int {
	if tag := HashTag(key); tag != "" {
		key = tag
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
