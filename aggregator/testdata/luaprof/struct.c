/* A stand-alone struct.pack / struct.unpack for the formats apply.lua uses ('<', 'B', 'I<n>' with
 * n up to 8, little-endian, unsigned), so that the script runs under a stand-alone Lua 5.1 at the
 * speed of the C library Redis gives it. Only for the profiler in this directory. */
#include <lua.h>
#include <lauxlib.h>
#include <string.h>

static int width(const char **f) {
  char c = **f;
  (*f)++;
  if (c == 'B') return 1;
  if (c == 'I') {
    int n = 0;
    while (**f >= '0' && **f <= '9') { n = n * 10 + (**f - '0'); (*f)++; }
    return n ? n : 4;
  }
  return 0;
}

static int pack(lua_State *L) {
  const char *f = luaL_checkstring(L, 1);
  luaL_Buffer b;
  int arg = 2;
  luaL_buffinit(L, &b);
  while (*f) {
    if (*f == '<') { f++; continue; }
    int w = width(&f);
    if (!w) return luaL_error(L, "format not supported");
    double x = luaL_checknumber(L, arg++);
    unsigned long long v = (unsigned long long)x;
    for (int i = 0; i < w; i++) { luaL_addchar(&b, (char)(v & 0xff)); v >>= 8; }
  }
  luaL_pushresult(&b);
  return 1;
}

static int unpack(lua_State *L) {
  const char *f = luaL_checkstring(L, 1);
  size_t len;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 2, &len);
  size_t pos = (size_t)luaL_optinteger(L, 3, 1) - 1;
  int n = 0;
  while (*f) {
    if (*f == '<') { f++; continue; }
    int w = width(&f);
    if (!w) return luaL_error(L, "format not supported");
    if (pos + w > len) return luaL_error(L, "data string too short");
    unsigned long long v = 0;
    for (int i = w - 1; i >= 0; i--) v = (v << 8) | s[pos + i];
    lua_pushnumber(L, (lua_Number)v);
    pos += w;
    n++;
  }
  lua_pushinteger(L, (lua_Integer)pos + 1);
  return n + 1;
}

int luaopen_struct(lua_State *L) {
  static const luaL_Reg fns[] = {{"pack", pack}, {"unpack", unpack}, {NULL, NULL}};
  luaL_register(L, "struct", fns);
  return 1;
}
