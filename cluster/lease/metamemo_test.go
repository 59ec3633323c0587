package lease

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestMetaEqualEveryEncodedField: metaBytes reuses its last encoding
// while meta.equal holds, so equal must see a change of every field the
// encoding carries (a field added to meta and not to equal fails here).
func TestMetaEqualEveryEncodedField(t *testing.T) {
	base := meta{V: metaVersion}
	rt := reflect.TypeOf(base)
	for i := range rt.NumField() {
		f := rt.Field(i)
		t.Run(f.Name, func(t *testing.T) {
			changed := base
			v := reflect.ValueOf(&changed).Elem().Field(i)
			switch v.Kind() {
			case reflect.String:
				v.SetString("x")
			case reflect.Bool:
				v.SetBool(true)
			case reflect.Int, reflect.Int64:
				v.SetInt(3)
			case reflect.Uint64, reflect.Uint8, reflect.Uint:
				v.SetUint(3)
			case reflect.Slice:
				v.Set(reflect.ValueOf([]string{"x"}))
			default:
				t.Fatalf("field %s of kind %v: teach this test", f.Name, v.Kind())
			}
			a, _ := json.Marshal(base)
			b, _ := json.Marshal(changed)
			encoded := string(a) != string(b)
			if base.equal(changed) == encoded {
				t.Errorf("equal %v for a change of %s that the encoding %s", base.equal(changed), f.Name,
					map[bool]string{true: "carries", false: "does not carry"}[encoded])
			}
		})
	}
}

// TestMetaBytesMemo: the memo returns the same encoding while nothing
// changed and a new one when something did.
func TestMetaBytesMemo(t *testing.T) {
	m := &Machine{cfg: Config{Name: "a", Role: Voter, Priority: 1}}
	first := string(m.metaBytes())
	if again := string(m.metaBytes()); again != first {
		t.Fatalf("same state encoded %s, then %s", first, again)
	}
	m.cfg.Priority = 2
	if changed := string(m.metaBytes()); changed == first {
		t.Fatalf("a priority change kept the encoding %s", changed)
	}
	md, ok := parseMeta(m.metaBytes())
	if !ok || md.Priority != 2 {
		t.Fatalf("parsed %+v, %v", md, ok)
	}
}
