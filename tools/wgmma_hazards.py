"""Issue 6 tool (CPU): scan a kernel's SASS for instructions that touch the registers of a wgmma still in flight: a
write to a register an issued `HGMMA` reads as its A operand, or any access to its accumulator, before the
`WARPGROUP.DEPBAR` that retires it. Each loop with an `HGMMA` is walked straight through twice (its back edge taken
once), branches inside it ignored: a heuristic, but it found the reuse of P's registers behind runs 12–13's NaN.

    SASS_OUT=k.sass python tools/gluon_attention.py --compile --config 64,64,2,4 --overlap-pv 1; python tools/wgmma_hazards.py k.sass
"""
import re, sys
lines=[l for l in open(sys.argv[1]) if re.match(r"\s*/\*[0-9a-f]{4}\*/", l)]
ins=[(int(re.match(r"\s*/\*([0-9a-f]{4})\*/",l).group(1),16), l.split("*/",1)[1].split(";")[0].strip()) for l in lines]
addr={a:i for i,(a,t) in enumerate(ins)}
def regrange(tok, n):  # R120 with n regs
    b=int(tok[1:]); return set(range(b,b+n))
# find loops (backward branches)
for i,(a,t) in enumerate(ins):
    m=re.search(r"BRA (0x[0-9a-f]+)", t)
    if not m: continue
    tgt=int(m.group(1),16)
    if tgt>=a: continue
    body=ins[addr[tgt]:i+1]
    if not any("HGMMA" in x for _,x in body): continue
    # simulate two passes of the loop body
    seq=body+body
    groups=[]; cur_read=set(); cur_acc=set()
    hazards=[]
    for aa,tt in seq:
        op=tt.split()[1] if tt.startswith("@") else tt.split()[0]
        if op.startswith("HGMMA"):
            mm=re.match(r"(?:@\S+ )?HGMMA\.(\d+)x(\d+)x\d+\.\S+ (R\d+), (R\d+|gdesc\[\w+\])", tt)
            M,N=int(mm.group(1)),int(mm.group(2)); accn=M*N//128
            cur_acc|=regrange(mm.group(3),accn)
            if mm.group(4).startswith("R"): cur_read|=regrange(mm.group(4),4)
            if "gsb0" in tt: groups.append((cur_read,cur_acc,aa)); cur_read=set(); cur_acc=set()
            continue
        if op.startswith("WARPGROUP.DEPBAR"):
            n=int(tt.split(",")[-1],16); groups=groups[len(groups)-n:] if n else []
            continue
        regs=[int(x) for x in re.findall(r"\bR(\d+)\b", tt)]
        if not regs: continue
        dst=regs[0]
        for (rd,acc,ga) in groups + ([(cur_read,cur_acc,-1)] if cur_acc else []):
            if dst in rd or dst in acc or any(r in acc for r in regs[1:]):
                hazards.append((hex(aa),tt,hex(ga)))
    print(f"loop {hex(tgt)}-{hex(a)}: {len(hazards)} hazards"); [print("   ",h) for h in hazards[:6]]
