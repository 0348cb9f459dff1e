import XCTest
@testable import OamNative

final class PlanSchemaTests: XCTestCase {
    func conv(_ s: String, _ name: String = "Answer") throws -> PlanSchema { try PlanSchema.convert(try JSON.parse(s), rootName: name) }

    func testObjectPropertyOrderFollowsRequiredThenAlphabetical() throws {
        let s = try conv("""
        {"type":"object","properties":{"choice":{"type":"string"},"reasoning":{"type":"string"},"aside":{"type":"string"}},
         "required":["reasoning","choice"]}
        """)
        guard case .object(let name, _, let props) = s.root else { return XCTFail() }
        XCTAssertEqual(name, "Answer")
        XCTAssertEqual(props.map(\.name), ["reasoning", "choice", "aside"])
        XCTAssertEqual(props.map(\.isOptional), [false, false, true])
    }

    /// A number bound that overflowed to infinity in the JSON is refused, not kept as `inf`.
    func testInfiniteNumberBoundsAreRefused() {
        for key in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
            for v in ["1e999", "-1e999"] {
                let bad = #"{"type":"number","\#(key)":\#(v)}"#
                XCTAssertThrowsError(try conv(bad)) { e in
                    XCTAssertEqual((e as? OamError)?.code, "invalid_schema", bad)
                    XCTAssertTrue((e as? OamError)?.message.contains("\(key) must be a finite number") ?? false, bad)
                }
            }
        }
        XCTAssertNoThrow(try conv(#"{"type":"number","exclusiveMinimum":1e300}"#))
    }

    /// Counts and integer bounds that would trap in Int(_: Double) are refused with
    /// invalid_schema (the trap would take the host process down).
    func testOutOfRangeNumbersAreRefusedNotTrapped() {
        for bad in [
            #"{"type":"array","items":{"type":"string"},"minItems":1e30}"#,
            #"{"type":"array","items":{"type":"string"},"maxItems":1e30}"#,
            #"{"type":"array","items":{"type":"string"},"maxItems":3e9}"#,
            #"{"type":"integer","exclusiveMinimum":1e300}"#,
            #"{"type":"integer","exclusiveMaximum":-1e300}"#,
            #"{"type":"integer","exclusiveMaximum":1e300}"#,
            #"{"type":"integer","minimum":1e300}"#,
            #"{"type":"integer","maximum":-1e20}"#,
        ] {
            XCTAssertThrowsError(try conv(bad)) { e in
                XCTAssertEqual((e as? OamError)?.code, "invalid_schema", bad)
                XCTAssertTrue((e as? OamError)?.message.contains("out of range") ?? false, bad)
            }
        }
        XCTAssertEqual(try conv(#"{"type":"integer","exclusiveMinimum":-1,"exclusiveMaximum":9e15}"#).root,
                       .integer(minimum: 0, maximum: 8_999_999_999_999_999))
    }

    func testExplicitOrderList() throws {
        let s = try conv(#"{"type":"object","x-order":["z","a"],"properties":{"a":{"type":"string"},"z":{"type":"string"},"m":{"type":"boolean"}}}"#)
        guard case .object(_, _, let props) = s.root else { return XCTFail() }
        XCTAssertEqual(props.map(\.name), ["z", "a", "m"])
    }

    func testEnumBecomesChoicesAndRangesBecomeGuides() throws {
        let s = try conv("""
        {"type":"object","required":["mood","hp","ratio","items"],"properties":{
          "mood":{"type":"string","enum":["calm","angry"],"description":"NPC mood"},
          "hp":{"type":"integer","minimum":0,"exclusiveMaximum":101},
          "ratio":{"type":"number","maximum":1.5},
          "items":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":3}}}
        """)
        guard case .object(_, _, let props) = s.root else { return XCTFail() }
        XCTAssertEqual(props[0].node, .choices(name: "Answer_mood", description: "NPC mood", values: ["calm", "angry"]))
        XCTAssertEqual(props[0].description, "NPC mood")
        XCTAssertEqual(props[1].node, .integer(minimum: 0, maximum: 100))
        XCTAssertEqual(props[2].node, .number(minimum: nil, maximum: 1.5))
        XCTAssertEqual(props[3].node, .array(items: .string, minItems: 1, maxItems: 3))
        XCTAssertEqual(s.warnings, [])
    }

    func testUnenforceableConstraintsBecomeWarningsAndDescriptions() throws {
        let s = try conv("""
        {"type":"object","required":["code"],"properties":{"code":{"type":"string","description":"Door code","pattern":"^[0-9]{4}$","minLength":4},
          "tags":{"type":"array","uniqueItems":true,"items":{"type":"string","format":"email"}}}}
        """)
        guard case .object(_, _, let props) = s.root else { return XCTFail() }
        XCTAssertEqual(props[0].node, .string)
        XCTAssertEqual(props[0].description, "Door code; pattern: ^[0-9]{4}$; minLength: 4")
        XCTAssertTrue(props[1].description?.contains("each item: format: email") ?? false, props[1].description ?? "nil")
        XCTAssertTrue(props[1].description?.contains("uniqueItems") ?? false)
        XCTAssertEqual(s.warnings.count, 4, "\(s.warnings)")
        XCTAssertTrue(s.warnings.contains { $0.hasPrefix("$.code:") && $0.contains("pattern") })
    }

    func testRefsAndRecursion() throws {
        let s = try conv("""
        {"type":"object","required":["root"],"properties":{"root":{"$ref":"#/$defs/Node"},"id":{"$ref":"#/$defs/Id"}},
         "$defs":{"Node":{"type":"object","required":["label"],"properties":{"label":{"type":"string"},
                  "children":{"type":"array","items":{"$ref":"#/$defs/Node"}}}},
                  "Id":{"type":"integer","minimum":1}}}
        """)
        guard case .object(_, _, let props) = s.root else { return XCTFail() }
        XCTAssertEqual(props[0].node, .reference("Node"))
        XCTAssertEqual(props[1].node, .integer(minimum: 1, maximum: nil))   // primitive defs are inlined
        XCTAssertEqual(s.dependencies.count, 1)
        guard case .object(let n, _, let nodeProps) = s.dependencies[0] else { return XCTFail() }
        XCTAssertEqual(n, "Node")
        XCTAssertEqual(nodeProps[1].node, .array(items: .reference("Node"), minItems: nil, maxItems: nil))
    }

    func testUnionsNullableAndLiterals() throws {
        let s = try conv("""
        {"type":"object","required":["a","b","c","d"],"properties":{
          "a":{"anyOf":[{"const":"yes"},{"const":"no"}]},
          "b":{"type":["string","null"]},
          "c":{"oneOf":[{"type":"object","properties":{"x":{"type":"integer"}}},{"type":"object","properties":{"y":{"type":"boolean"}}}]},
          "d":{"enum":[1,2,null]}}}
        """)
        guard case .object(_, _, let props) = s.root else { return XCTFail() }
        XCTAssertEqual(props[0].node, .choices(name: "Answer_a", description: nil, values: ["yes", "no"]))
        XCTAssertEqual(props[1].node, .string)
        XCTAssertTrue(props[1].isOptional)                       // nullable -> optional
        guard case .union(_, _, let members) = props[2].node else { return XCTFail("\(props[2].node)") }
        XCTAssertEqual(members.count, 2)
        XCTAssertEqual(props[3].node, .choices(name: "Answer_d", description: "may be null", values: ["1", "2"]))
        XCTAssertTrue(props[3].isOptional)
        XCTAssertTrue(s.warnings.contains { $0.contains("non-string enum") })
    }

    func testNamesAreUnique() throws {
        let s = try conv(#"{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"enum":["x"]}}},"a_b":{"enum":["y"]}}}"#)
        var names: [String] = []
        func walk(_ n: PlanSchemaNode) {
            if let t = n.typeName { names.append(t) }
            switch n {
            case .object(_, _, let p): p.forEach { walk($0.node) }
            case .union(_, _, let m): m.forEach(walk)
            case .array(let i, _, _): walk(i)
            default: break
            }
        }
        walk(s.root)
        XCTAssertEqual(Set(names).count, names.count, "\(names)")
    }

    func testInvalidSchemas() {
        for bad in [
            #"{"type":"null"}"#, ##"{"type":"object","properties":{"a":{"$ref":"#/$defs/Missing"}}}"##,
            #"{"$ref":"https://example.com/s.json"}"#, #"{"type":"integer","minimum":5,"maximum":1}"#,
            #"{"type":"array","items":[{"type":"string"}]}"#, #"{"type":"frob"}"#, #"[1]"#,
        ] {
            XCTAssertThrowsError(try conv(bad)) { e in XCTAssertEqual((e as? OamError)?.code, "invalid_schema", bad) }
        }
    }

    // npc/decide's schemas, as the Python host sends them (an "x-order" beside every
    // "properties"): the choice must stay a closed list of the options' names, never a free
    // string, and nothing may be reported as not enforced.

    func testADecisionWithoutArgumentsIsAnObjectWithReasoningFirstAndTheOptionsAsChoices() throws {
        let s = try conv("""
        {"type":"object","x-order":["reasoning","choice"],"properties":{
          "reasoning":{"type":"string","description":"why, in one short sentence"},
          "choice":{"type":"string","enum":["let_in","question"]}},"required":["reasoning","choice"]}
        """)
        XCTAssertEqual(s.root, .object(name: "Answer", description: nil, properties: [
            PlanSchemaProperty(name: "reasoning", description: "why, in one short sentence", node: .string, isOptional: false),
            PlanSchemaProperty(name: "choice", description: nil,
                               node: .choices(name: "Answer_choice", description: nil, values: ["let_in", "question"]),
                               isOptional: false),
        ]))
        XCTAssertEqual(s.dependencies, [])
        XCTAssertEqual(s.warnings, [])
    }

    func testADecisionWithArgumentsIsAUnionOfOneObjectPerShapeEachWithItsChoices() throws {
        let s = try conv("""
        {"anyOf":[
          {"type":"object","x-order":["reasoning","choice"],"properties":{
            "reasoning":{"type":"string"},"choice":{"type":"string","enum":["let_in","question"]}},
           "required":["reasoning","choice"]},
          {"type":"object","x-order":["reasoning","choice","arguments"],"properties":{
            "reasoning":{"type":"string"},"choice":{"const":"call_help"},
            "arguments":{"type":"object","x-order":["urgency"],"properties":{"urgency":{"type":"string","enum":["low","high"]}},
                         "required":["urgency"]}},
           "required":["reasoning","choice","arguments"]},
          {"type":"object","x-order":["reasoning","choice","arguments"],"properties":{
            "reasoning":{"type":"string"},"choice":{"type":"string","const":"give"},
            "arguments":{"type":"object","x-order":["item","count"],"properties":{"item":{"type":"string"},"count":{"type":"integer","minimum":1,"maximum":5}},
                         "required":["item","count"],"additionalProperties":false}},
           "required":["reasoning","choice","arguments"]}]}
        """)
        guard case .union(let name, _, let members) = s.root else { return XCTFail("\(s.root)") }
        XCTAssertEqual(name, "Answer")
        XCTAssertEqual(members.count, 3)
        var choices: [[String]] = []
        for m in members {
            guard case .object(_, _, let props) = m else { return XCTFail("\(m)") }
            XCTAssertEqual(props.first?.name, "reasoning")
            XCTAssertEqual(props.first?.node, .string)
            XCTAssertEqual(props.dropFirst().first?.name, "choice")
            XCTAssertTrue(props.allSatisfy { !$0.isOptional })
            guard case .choices(_, _, let values)? = props.dropFirst().first?.node else { return XCTFail("\(props)") }
            choices.append(values)
        }
        XCTAssertEqual(choices, [["let_in", "question"], ["call_help"], ["give"]])
        guard case .object(_, _, let second) = members[1], case .object(_, _, let args) = second[2].node else { return XCTFail() }
        XCTAssertEqual(args, [PlanSchemaProperty(name: "urgency", description: nil,
                                                 node: .choices(name: "Answer_2_arguments_urgency", description: nil,
                                                                values: ["low", "high"]), isOptional: false)])
        guard case .object(_, _, let third) = members[2], case .object(_, _, let give) = third[2].node else { return XCTFail() }
        XCTAssertEqual(give.map(\.name), ["item", "count"])
        XCTAssertEqual(give[1].node, .integer(minimum: 1, maximum: 5))
        XCTAssertEqual(s.warnings, [])

        // Every named type is unique (GenerationSchema refuses duplicates).
        var names: [String] = []
        func walk(_ n: PlanSchemaNode) {
            if let t = n.typeName { names.append(t) }
            switch n {
            case .object(_, _, let p): p.forEach { walk($0.node) }
            case .union(_, _, let m): m.forEach(walk)
            case .array(let i, _, _): walk(i)
            default: break
            }
        }
        walk(s.root)
        XCTAssertEqual(Set(names).count, names.count, "\(names)")
    }

    func testADecisionUnionWithATypeBesideAnyOfIsStillAUnion() throws {
        // {"type":"object","anyOf":[...]}: the alternatives decide, the type adds nothing.
        let s = try conv("""
        {"type":"object","anyOf":[
          {"type":"object","properties":{"choice":{"const":"wait"}},"required":["choice"]},
          {"type":"object","properties":{"choice":{"const":"go"},"arguments":{"type":"object","properties":{"to":{"enum":["north","south"]}},"required":["to"]}},
           "required":["choice","arguments"]}]}
        """)
        guard case .union(_, _, let members) = s.root, members.count == 2 else { return XCTFail("\(s.root)") }
        guard case .object(_, _, let first) = members[0] else { return XCTFail() }
        XCTAssertEqual(first.map(\.name), ["choice"])
        guard case .choices(_, _, let v) = first[0].node else { return XCTFail() }
        XCTAssertEqual(v, ["wait"])
        XCTAssertEqual(s.warnings, [])
    }

    func testToolParametersUseTheToolName() throws {
        let s = try conv(#"{"type":"object","properties":{"city":{"type":"string"}}}"#, "get weather")
        XCTAssertEqual(s.root.typeName, "get_weather")
    }
}
